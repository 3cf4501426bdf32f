#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-command check on a GPU machine (torch, nvcc, pybind11, ninja and cmake installed; no
# internet needed). From the repository root:
#
#   bash bench/gpu_check.sh
#
# Steps, most valuable first, each under its own time limit (the whole script under 8 minutes):
#   1. build          the extension from source in place (sm_90a), build_info, NCCL version, and
#                     the cubin gate (tests/cuda/test_cubins.py: no local memory in the hot
#                     kernels);
#   2. cuda_tests     the CUDA op tests against the reference and the golden data, and NCCL;
#   3. symm_sim       the symm kernels with simulated ranks and through the production launch
#                     (tests/cuda/test_cuda_symm.py: eager, CUDA graphs, two streams, timeouts);
#      symm_world     two processes on this one GPU through torch symmetric memory
#                     (tests/cuda/test_cuda_symm_world.py: the transport a multi-GPU user runs);
#   4. memcheck       compute-sanitizer memcheck on small cases of every op and the symm kernels;
#   5. symm_timings   the decode (tp = 8 simulated; T = 1, 4, 16) and sharded (T = 8192)
#                     boundaries, each beside its roofline (bench/symm_harness.py);
#      op_bench       mhc-sp-bench ops --device cuda at H = 7168 (% of the copy bandwidth).
# Everything the run produces goes to $OUT (default bench/out), at most 8 files: gpu_check.log
# (all output), summary.json (per step: status ok / failed / timeout / skipped, seconds, limit,
# pytest counts, failed and skipped test names; "ok" only when every step is ok), symm_harness.json
# and bench.json. A step that does not run (its budget or the script's is spent, or the build
# failed), or a pytest step whose every test skipped, is "skipped", never "ok".
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/bench/out}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
SUMMARY=$OUT/summary.json
WORK=$(mktemp -d)
PY=${PYTHON:-$(command -v python3 || command -v python)}
: >"$LOG"

# Per-step limits in seconds (override from the environment), sized from the work on an H200
# with 16 cores: six CUDA translation units for one architecture compiled in parallel; about 400
# CUDA op tests (torch.compile once); about 60 symm checks of microseconds each; four spawned
# two-rank worlds (a few seconds of start-up each, a 3 s timeout waited out twice, a 7 s late
# rank); memcheck of a few small launches; a dozen timed graph replays.
T_BUILD=${T_BUILD:-150}
T_INFO=${T_INFO:-10}
T_GATE=${T_GATE:-15}
T_TESTS=${T_TESTS:-80}
T_SIM=${T_SIM:-50}
T_WORLD=${T_WORLD:-100}
T_SANITIZER=${T_SANITIZER:-30}
T_TIMING=${T_TIMING:-20}
T_BENCH=${T_BENCH:-20}
T_TOTAL=${T_TOTAL:-475} # the whole script: one rerun fits in 15 minutes of GPU time

export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH
export MHC_SP_CUDA=1
export MHC_SP_TESTING=1 # the simulated symm ranks (mhc_sp._testing) the checks below run
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

STEPS=()
log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

record() { # name status rc seconds limit [extra json fields]
  STEPS+=("{\"name\": \"$1\", \"status\": \"$2\", \"rc\": $3, \"seconds\": $4, \"limit\": $5${6:+, $6}}")
}

skip() {
  log "=== $1: skipped ($2)"
  STEPS+=("{\"name\": \"$1\", \"status\": \"skipped\", \"reason\": \"$2\"}")
}

# step NAME LIMIT CMD...: runs CMD under a timeout (never past the script's total budget), output
# to the log and the terminal; records status, rc, seconds and, for pytest steps (a junit file in
# $WORK/NAME.xml), the test counts and the failed tests. Returns the command's exit status.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((T_TOTAL - SECONDS))
  if ((left < 10)); then
    skip "$name" "the script's ${T_TOTAL}s budget is spent"
    return 125
  fi
  ((limit > left)) && limit=$left
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
  local extra=""
  if [[ -f $WORK/$name.xml ]]; then
    extra=$("$PY" - "$WORK/$name.xml" <<'EOF'
import json, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
failed, skipped = [], []
for case in root.iter("testcase"):
    test = f"{case.get('classname')}::{case.get('name')}"
    for kind in ("failure", "error"):
        for e in case.findall(kind):
            failed.append({"test": test, "message": (e.get("message") or "")[:300]})
    for e in case.findall("skipped"):
        skipped.append({"test": test, "reason": (e.get("message") or "")[:200]})
print(f'"pytest": {json.dumps(count)}, "failed_tests": {json.dumps(failed)}, '
      f'"skipped_tests": {json.dumps(skipped)}')
print("all_skipped" if count["tests"] and count["skipped"] == count["tests"] else "ran")
EOF
    )
    # A pytest step whose every test skipped did not check anything: skipped, not ok.
    if [[ $status == ok && ${extra##*$'\n'} == all_skipped ]]; then status=skipped; fi
    extra=${extra%$'\n'*}
  fi
  log "=== $name: $status (rc=$rc, ${dt}s)"
  record "$name" "$status" "$rc" "$dt" "$limit" "$extra"
  return "$rc"
}

write_summary() {
  local IFS=,
  local gpu
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  printf '{"host": "%s", "gpu": "%s", "seconds": %d, "steps": [%s]}\n' "$(hostname)" "$gpu" \
    "$SECONDS" "${STEPS[*]}" >"$SUMMARY"
  "$PY" - "$SUMMARY" <<'EOF'
import json, sys
path = sys.argv[1]
s = json.load(open(path))
s["ok"] = bool(s["steps"]) and all(step["status"] == "ok" for step in s["steps"])
json.dump(s, open(path, "w"), indent=1)
print("summary:", "ok" if s["ok"] else "NOT ok", [(t["name"], t["status"]) for t in s["steps"]])
EOF
  # What comes back is at most 16 MiB a file.
  [[ $(stat -c %s "$LOG") -gt 15000000 ]] && truncate -s 15000000 "$LOG"
  rm -rf "$WORK"
  log "summary: $SUMMARY"
}
trap write_summary EXIT

log "root $ROOT, out $OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 | tee -a "$LOG"
nvcc --version 2>&1 | tail -2 | tee -a "$LOG"

# 1. build, then what the build made: build_info and the cubin gate
if ! step build "$T_BUILD" "$PY" setup.py build_ext --inplace; then
  for s in build_info cubin_gate cuda_tests symm_sim symm_world memcheck symm_timings op_bench; do
    skip "$s" "the build failed"
  done
  exit 1
fi
step build_info "$T_INFO" "$PY" -c '
import torch, mhc_sp
info = mhc_sp.build_info()
for k, v in sorted(info.items()):
    print(f"{k}: {v}")
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("nccl (torch):", ".".join(map(str, torch.cuda.nccl.version())))
assert info["cuda"], "extension built without CUDA"
'
step cubin_gate "$T_GATE" "$PY" -m pytest -q -ra --junitxml="$WORK/cubin_gate.xml" \
  tests/cuda/test_cubins.py

# 2. the CUDA op tests
tests=(tests/cuda/test_cuda_ops.py tests/cuda/test_cuda_invariance.py tests/cuda/test_nccl.py
  tests/cuda/test_cuda_vs_emulation.py)
step cuda_tests "$T_TESTS" "$PY" -m pytest -q -ra --junitxml="$WORK/cuda_tests.xml" "${tests[@]}"

# 3. the symm transport's correctness: simulated ranks and the production launch, then two
# processes on this GPU
step symm_sim "$T_SIM" "$PY" -m pytest -q -ra --junitxml="$WORK/symm_sim.xml" \
  tests/cuda/test_cuda_symm.py
step symm_world "$T_WORLD" "$PY" -m pytest -q -ra --junitxml="$WORK/symm_world.xml" \
  tests/cuda/test_cuda_symm_world.py

# 4. memcheck: small shapes through every op and both pre paths (fused <= 16 tokens, two kernels
# above; vector and scalar hidden sizes), and the symm kernels (decode and sharded, production
# launch and two simulated ranks).
if command -v compute-sanitizer >/dev/null 2>&1; then
  step memcheck "$T_SANITIZER" compute-sanitizer --tool memcheck --error-exitcode 3 "$PY" -c '
import torch
from mhc_sp import _C, _testing
from mhc_sp.config import MhcConfig
from mhc_sp.testing import OPS, pre_weights, random_inputs
for T, n, H in [(3, 4, 256), (70, 4, 72), (5, 2, 33)]:
    i = random_inputs(T, n, H, seed=1, device="cuda")
    for info in OPS.values():
        info.call(info.sample(i))
from mhc_sp import reference as R
C = _C.symm_constants()
for tp, production in ((1, True), (2, False)):
    sim = _testing.SymmSimGroup(tp, 0, C["default_mailbox_slot_bytes"], 1 << 22, 30.0)
    for T, sharded in ((3, False), (5, True)):
        i = random_inputs(T, 4, 256, seed=2, device="cuda")
        parts = [torch.randn(T, 256, device="cuda").bfloat16() for _ in range(tp)]
        own = lambda t, r: R.shard_tokens(t, r, tp).contiguous() if sharded else t
        rows = [[own(i[k], r) for r in range(tp)] for k in ("residual", "post", "comb")]
        cfg = MhcConfig().scalars()
        sim.fused_layer(parts, *rows, *pre_weights(i), sharded, T, *cfg, production=production)
    xs = [torch.randn(3, 256, device="cuda").bfloat16() for _ in range(tp)]
    sim.collective("all_reduce", xs, production=production)
    assert all(e is None for e in sim.errors()), sim.errors()
torch.cuda.synchronize()
print("memcheck run complete")
'
else
  skip memcheck "compute-sanitizer not found"
fi

# 5. timings last: the symm boundaries beside their rooflines, then the op benchmark (the V4-Pro
# hidden size against the eager reference; the full sweep, compiled baseline included, is
#   python -m mhc_sp.bench ops --device cuda --tokens 1,16,256,4096,16384 \
#     --hidden-size 4096,7168 --json F).
step symm_timings "$T_TIMING" "$PY" bench/symm_harness.py --json "$OUT/symm_harness.json" \
  --budget-s $((T_TIMING - 8))
step op_bench "$T_BENCH" "$PY" -m mhc_sp.bench ops --device cuda --json "$OUT/bench.json" \
  --budget-s $((T_BENCH - 10)) --hidden-size 7168 --tokens 1,16,4096,16384 --compare eager \
  --repeats 10
exit 0
