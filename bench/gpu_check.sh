#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-command check on a GPU machine (torch, nvcc, pybind11, ninja and cmake installed; no
# internet needed). From the repository root:
#
#   bash bench/gpu_check.sh
#
# Builds the extension from source in place, prints build_info and the NCCL version, runs the
# CUDA tests (against the reference and the golden data in tests/data, and any NCCL tests), tries
# compute-sanitizer memcheck on a small case, runs the op benchmark (mhc-sp-bench ops --device
# cuda), and leaves under $OUT (default bench/out): gpu_check.log (everything), summary.json (one
# entry per step: status, seconds, exit code), symm_harness.json (the symm transport's simulated-
# rank check), bench.json, and the junit XML of the tests. Every
# step has its own timeout; the defaults add up to less than 8 minutes.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench/out}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
SUMMARY=$OUT/summary.json
PY=${PYTHON:-$(command -v python3 || command -v python)}
: >"$LOG"

# Per-step limits in seconds (override from the environment).
T_ENV=${T_ENV:-15}
T_BUILD=${T_BUILD:-170}
T_INFO=${T_INFO:-20}
T_TESTS=${T_TESTS:-80}
T_SANITIZER=${T_SANITIZER:-30}
T_SYMM=${T_SYMM:-60}
T_BENCH=${T_BENCH:-100}

export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH
export MHC_SP_CUDA=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

STEPS=()
log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

# step NAME LIMIT CMD...: runs CMD with a timeout, output to the log and the terminal, and records
# {name, status, rc, seconds} for summary.json. Never aborts the script.
step() {
  local name=$1 limit=$2
  shift 2
  log "=== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  local dt=$((SECONDS - t0)) status=ok
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    status=timeout
  elif [[ $rc -ne 0 ]]; then
    status=failed
  fi
  log "=== $name: $status (rc=$rc, ${dt}s)"
  STEPS+=("{\"name\": \"$name\", \"status\": \"$status\", \"rc\": $rc, \"seconds\": $dt}")
  return "$rc"
}

skip() {
  log "=== $1: skipped ($2)"
  STEPS+=("{\"name\": \"$1\", \"status\": \"skipped\", \"reason\": \"$2\"}")
}

write_summary() {
  local IFS=,
  printf '{"host": "%s", "steps": [%s]}\n' "$(hostname)" "${STEPS[*]}" >"$SUMMARY"
  log "summary: $SUMMARY"
}
trap write_summary EXIT

log "root $ROOT, out $OUT"
step environment "$T_ENV" bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvcc --version | tail -2; '"$PY"' -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"gpu\", torch.cuda.is_available())"'

if ! step build "$T_BUILD" "$PY" setup.py build_ext --inplace; then
  skip build_info "build failed"
  exit 1
fi

step build_info "$T_INFO" "$PY" -c '
import torch, mhc_sp
info = mhc_sp.build_info()
for k, v in sorted(info.items()):
    print(f"{k}: {v}")
print("nccl (torch):", ".".join(map(str, torch.cuda.nccl.version())))
assert info["cuda"], "extension built without CUDA"
'

tests=(tests/test_cuda_ops.py)
for f in tests/test_*cuda*.py tests/test_*nccl*.py; do
  [[ -f $f && $f != tests/test_cuda_ops.py ]] && tests+=("$f")
done
step tests "$T_TESTS" "$PY" -m pytest -q -ra --junitxml="$OUT/junit.xml" "${tests[@]}"

if command -v compute-sanitizer >/dev/null 2>&1; then
  # Small shapes through every op and both code paths (fused <= 16 tokens, two kernels above;
  # vector and scalar hidden sizes).
  step sanitizer "$T_SANITIZER" compute-sanitizer --tool memcheck --error-exitcode 3 "$PY" -c '
import torch
from mhc_sp.testing import OPS, random_inputs
for T, n, H in [(3, 4, 256), (70, 4, 72), (5, 2, 33)]:
    i = random_inputs(T, n, H, seed=1, device="cuda")
    for info in OPS.values():
        info.call(info.sample(i))
torch.cuda.synchronize()
print("memcheck run complete")
'
else
  skip sanitizer "compute-sanitizer not found"
fi

# The symm transport's kernels with simulated ranks on this one GPU (bench/symm_harness.py):
# correctness against the CUDA ops and the reference, graph replays, timeouts, and times.
step symm_harness "$T_SYMM" "$PY" bench/symm_harness.py --json "$OUT/symm_harness.json" \
  --budget-s $((T_SYMM - 15))

# The benchmark gets its own budget for new shapes, inside the step's hard timeout. Here the V4-Pro
# hidden size against the eager reference (torch.compile per shape would not fit); the full sweep,
# compiled baseline included, is
#   python -m mhc_sp.bench ops --device cuda --tokens 1,16,256,4096,16384 \
#     --hidden-size 4096,7168 --json F
step bench "$T_BENCH" "$PY" -m mhc_sp.bench ops --device cuda --json "$OUT/bench.json" \
  --budget-s $((T_BENCH - 30)) --hidden-size 7168 --tokens 1,16,256,4096,16384 --compare eager \
  --repeats 10
exit 0
