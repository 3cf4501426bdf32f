#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The tests marked `slow` (left out of the default suite), with their durations.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest -q -m slow --durations=0 "$@"
