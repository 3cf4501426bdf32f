#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The tests marked `slow`, which the default run (pyproject: -m 'not slow') leaves out: tp=8
# boundaries at every edge-case token count and the model's --check at tp=8, every injected fault
# at worlds 4 and 8, tp=2 x pp=2 across namespace-separated hosts (root only), and the install
# path (tests/repo/test_install.py: an isolated pip build stopping before it compiles; the wheel
# built with `pip wheel --no-build-isolation --no-deps .`, installed into a fresh environment that
# reuses the installed torch, and run from outside the source tree: it compiles the extension,
# CPU-only unless MHC_SP_CUDA says otherwise). Several minutes on 2 cores. Extra arguments go to
# pytest: bash scripts/slow_tests.sh -k faults
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest -q -m slow --durations=0 "$@"
