# SPDX-License-Identifier: Apache-2.0
"""The multi-process harness the tests use: mhc_sp.launch (shared with the benchmark CLI)."""

from mhc_sp.launch import COLLECTIVE_TIMEOUT_S, run_world  # noqa: F401
