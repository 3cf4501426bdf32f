# SPDX-License-Identifier: Apache-2.0
"""Tests of mhc_sp's engine plugins (mhc_sp.integrations) that run without the engines installed."""
