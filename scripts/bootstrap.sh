#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sets up .venv (torch 2.14.1, test tools, linters) and builds mhc_sp into it (editable). Idempotent: a
# second run only rebuilds what changed. CUDA sources are compiled when nvcc is found
# (MHC_SP_CUDA=auto|0|1, CUDA_HOME defaults to /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel >/dev/null
# The linters are pinned: tests/repo/test_lint.py checks the tree with exactly these versions.
.venv/bin/python -m pip install -q "torch==2.14.1" numpy pybind11 ninja "cmake>=3.24" pytest \
  hypothesis safetensors matplotlib ruff==0.17.6 clang-format==23.1.5
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# The test-only module mhc_sp._testing beside mhc_sp._C: the tests use it.
export MHC_SP_TESTING=${MHC_SP_TESTING:-1}
MAX_JOBS=${MAX_JOBS:-$(nproc)} .venv/bin/python -m pip install -q --no-build-isolation -e .
.venv/bin/python -c "import mhc_sp; print('mhc_sp build:', mhc_sp.build_info())"
