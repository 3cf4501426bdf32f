#!/usr/bin/env bash
# One-command check on a lent GPU machine (H200; no internet; torch + nvcc + pybind11 + ninja +
# cmake preinstalled). From the repository root:
#
#   bash bench/gpu_check.sh
#
# Builds the extension from source in place, prints build_info and the NCCL version, runs the
# CUDA tests (and any NCCL tests), tries compute-sanitizer memcheck on a small case, runs the op
# benchmark, and leaves under $OUT (default bench/out): gpu_check.log (everything), summary.json
# (one entry per step: status, seconds, exit code), bench.json, and the junit XML of the tests.
# Every step has its own timeout; the defaults add up to less than 8 minutes.
#
# Only the repository travels to a lent machine, so the golden data beside a development checkout
# (../shared/golden) must come along in the ignored folder .golden/: before the call,
#   mkdir -p .golden && cp ../shared/golden/mhc_v4_golden.pt .golden/
# and name ".golden" in the device tool's carry list.
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
T_TESTS=${T_TESTS:-100}
T_SANITIZER=${T_SANITIZER:-40}
T_BENCH=${T_BENCH:-100}

export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH
export MHC_SP_CUDA=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
# The golden data lives beside the repository in development checkouts; use it when present.
if [[ -z "${MHC_SP_GOLDEN:-}" ]]; then
  for g in "$ROOT/../shared/golden/mhc_v4_golden.pt" "$ROOT/shared/golden/mhc_v4_golden.pt" \
    "$ROOT/.golden/mhc_v4_golden.pt"; do
    [[ -f $g ]] && export MHC_SP_GOLDEN=$g && break
  done
fi

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
from mhc_sp import ops
from mhc_sp import reference as R
for T, n, H in [(3, 4, 256), (70, 4, 72), (5, 2, 33)]:
    i = R.random_inputs(T, n, H, seed=1, device="cuda")
    ops.mhc_post(i["x"], i["residual"], i["post"], i["comb"])
    ops.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], i["norm_weight"])
    ops.mhc_post_pre(i["x"], i["residual"], i["post"], i["comb"], i["fn"], i["scale"], i["base"], i["norm_weight"])
    ops.mhc_pre_broadcast(i["x"], i["fn"], i["scale"], i["base"], i["norm_weight"])
    ops.hc_head(i["residual"], i["head_fn"], i["head_scale"], i["head_base"])
torch.cuda.synchronize()
print("memcheck run complete")
'
else
  skip sanitizer "compute-sanitizer not found"
fi

# The benchmark gets its own budget for new cases, inside the step's hard timeout. Here only the
# V4-Pro hidden size; the full sweep (H 4096 and 7168) is `python bench/gpu_bench_ops.py --json F`.
step bench "$T_BENCH" "$PY" bench/gpu_bench_ops.py --json "$OUT/bench.json" --budget-s $((T_BENCH - 25)) \
  --hidden 7168 --samples 3 --target-ms 10
exit 0
