#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-command check on a GPU machine (torch, nvcc, pybind11, ninja and cmake installed; no
# internet needed). From the repository root:
#
#   bash bench/gpu_check.sh                  # phase 1, then phase 2
#   bash bench/gpu_check.sh --phase 1        # or --phase 2
#   bash bench/gpu_check.sh --only cuda_tests,symm_world    # rerun what failed
#
# The build runs first in every case (the other steps need it; on a machine that has built it
# already it only checks that nothing changed, a few seconds).
#
# Phase 1, correctness (under 4 minutes on an H200 with 16 cores, as measured):
#   build          the extension from source in place (sm_90a, the testing module included);
#   build_info     what was built, the CUDA and NCCL versions;
#   cubin_gate     tests/cuda/test_cubins.py: no local memory in the hot kernels, read from the
#                  cubins with cuobjdump ("partial" without cuobjdump);
#   cuda_tests     the CUDA op tests against the reference and the golden data, and NCCL
#                  (tests/cuda/test_cuda_ops.py, tests/cuda/test_cuda_invariance.py,
#                  tests/cuda/test_nccl.py), and the GPU's outputs against the emulated device's
#                  on the same inputs (tests/cuda/test_cuda_vs_emulation.py);
#   symm_sim       the symm kernels with simulated ranks and through the production launch
#                  (tests/cuda/test_cuda_symm.py: eager, CUDA graphs, two streams, timeouts);
#   symm_world     two processes on this one GPU through torch symmetric memory
#                  (tests/cuda/test_cuda_symm_world.py: the transport a multi-GPU user runs).
#                  Skipped, saying why, when an MPS daemon runs: under MPS the two processes'
#                  kernels run side by side, and one rank's spinning blocks can fill the GPU.
# Phase 2, memory checks and timings:
#   memcheck       compute-sanitizer memcheck on small cases of every op and the symm kernels
#                  (skipped with the tool's own words when it cannot run a CUDA program on the
#                  machine's GPU: some container runtimes refuse the device);
#   symm_timings   the decode (tp = 8 simulated; T = 1, 4, 16) and sharded (T = 8192)
#                  boundaries, each beside its roofline (bench/symm_harness.py);
#   op_bench       mhc-sp-bench ops --device cuda at H = 7168 (% of the copy bandwidth).
#
# Phase 1 on an H200 with 16 cores, step by step, as measured (bench/results/gpu_check_h200.json:
# build to cuda_tests from the first run; symm_sim and symm_world from the rerun after the
# libstdc++ fix, the first run having failed them in seconds):
#   step         measured limit  what it ran
#   build          107 s   200 s  setup.py and a fresh cmake configure, 11 CUDA and 52 C++ units
#                                 (one architecture): 1209 s of compiles on 16 cores; the longest
#                                 units are the symm layer kernels (65 s) and the math ops (60 s)
#   build_info       4 s    30 s  python, torch and mhc_sp imports
#   cubin_gate       6 s    30 s  7 tests, cuobjdump on every built cubin
#   cuda_tests      35 s   150 s  245 tests (239 passed, 6 NCCL worlds of two ranks skipped: one
#                                 GPU), opcheck, torch.compile, the GPU against the emulated device
#   symm_sim        10 s    60 s  57 simulated-rank tests
#   symm_world      60 s   150 s  four spawned two-rank worlds on the one GPU
#   phase 1        222 s   620 s  (phase 2 measured: memcheck 5 s, symm_timings 6 s, op_bench
#                                 14 s, after a build that found nothing to do)
#
# What fits in 15 minutes of GPU time (measured: a machine started in about 30 s and is given back
# 30 s after a call, so a rerun is a fresh machine and a fresh build): phase 1 and phase 2 in one
# call (250 s with the start), then two fresh calls of about 190 s each (build, then a diagnosis or
# the rerun of the failed steps: --only). One H200 session used 733 s of its 900 s that way.
#
# Everything a run produces goes to $OUT (default bench/out), at most 8 files: gpu_check.log (all
# output), summary.json (per step: status, seconds, limit, pytest counts, failed tests, skipped
# tests; the selection run; "ok"), build_times.json (what each translation unit took),
# symm_harness.json and bench.json. A step's status:
#   ok       it passed; every test that did not run skipped for a listed hardware reason (e.g. a
#            world of 2 NCCL ranks on a machine with one GPU), listed under hardware_skips;
#   partial  it passed but some tests skipped for another reason (e.g. no cuobjdump);
#   skipped  it did not run (the build failed, its budget or the script's was spent, an MPS
#            daemon runs), or every one of its tests skipped;
#   failed / timeout.
# The run says "summary: ok" only when every step it ran is ok (bench/gpu_check_summary.py).
set -uo pipefail

# The steps in the order they run, most valuable first.
PHASE1_STEPS=(build build_info cubin_gate cuda_tests symm_sim symm_world)
PHASE2_STEPS=(memcheck symm_timings op_bench)
ALL_STEPS=("${PHASE1_STEPS[@]}" "${PHASE2_STEPS[@]}")

usage() {
  cat <<EOF
usage: bash bench/gpu_check.sh [--phase 1|2 | --only STEP[,STEP...]]
  --phase 1   ${PHASE1_STEPS[*]}
  --phase 2   build, then ${PHASE2_STEPS[*]}
  --only      build, then the named steps (in the order above)
Without either, every step. Output in \$OUT (default bench/out).
EOF
}

# parse_args ARGS...: sets SELECTED (the steps to run, in run order). On a bad argument prints one
# line to stderr and returns 2 (SELECTED unchanged); for --help prints the usage and returns 1.
parse_args() {
  local only="" phase="" given_only=0 given_phase=0
  while (($#)); do
    case $1 in
      --only | --phase)
        if (($# < 2)); then
          echo "$1: expected a value (--only STEP[,STEP...] or --phase 1|2)" >&2
          return 2
        fi
        if [[ $1 == --only ]]; then
          only=$2 given_only=1
        else
          phase=$2 given_phase=1
        fi
        shift 2
        ;;
      --only=*) only=${1#--only=} given_only=1 && shift ;;
      --phase=*) phase=${1#--phase=} given_phase=1 && shift ;;
      -h | --help)
        usage
        return 1
        ;;
      *)
        echo "gpu_check.sh: unknown argument '$1' (expected --phase 1|2 or --only STEP,...)" >&2
        return 2
        ;;
    esac
  done
  if ((given_only && given_phase)); then
    echo "--only and --phase: give one of them" >&2
    return 2
  fi
  local -a chosen=("${ALL_STEPS[@]}")
  if ((given_phase)); then
    case $phase in
      1) chosen=("${PHASE1_STEPS[@]}") ;;
      2) chosen=(build "${PHASE2_STEPS[@]}") ;;
      *)
        echo "--phase: expected 1 or 2, got '$phase'" >&2
        return 2
        ;;
    esac
  elif ((given_only)); then
    local -a named
    local s k known
    IFS=, read -ra named <<<"$only"
    if ((${#named[@]} == 0)); then
      echo "--only: expected a comma-separated list of steps (${ALL_STEPS[*]})" >&2
      return 2
    fi
    for s in "${named[@]}"; do
      known=0
      for k in "${ALL_STEPS[@]}"; do [[ $s == "$k" ]] && known=1; done
      if ((!known)); then
        echo "--only: unknown step '$s' in '$only' (steps: ${ALL_STEPS[*]})" >&2
        return 2
      fi
    done
    chosen=(build) # the other steps need it
    for k in "${ALL_STEPS[@]:1}"; do
      for s in "${named[@]}"; do
        if [[ $s == "$k" ]]; then
          chosen+=("$k")
          break
        fi
      done
    done
  fi
  SELECTED=("${chosen[@]}")
  return 0
}

# mps_daemon [PROC_ROOT] [PIPE_DIR]: when an MPS daemon serves this machine, prints why it is taken
# to (an nvidia-cuda-mps-control or -server process, or the control pipe clients connect to, which
# a container sees even when the daemon runs outside it) and returns 0; else returns 1.
mps_daemon() {
  local proc=${1:-/proc} pipe=${2:-${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}}
  local comm name
  for comm in "$proc"/[0-9]*/comm; do
    [[ -r $comm ]] || continue
    name=$(<"$comm") || continue
    # comm holds the first 15 characters: "nvidia-cuda-mps" for the control daemon and the server.
    if [[ $name == nvidia-cuda-mps* ]]; then
      local pid=${comm%/comm}
      echo "an MPS daemon runs (process ${pid##*/}, $name)"
      return 0
    fi
  done
  if [[ -p $pipe/control ]]; then
    echo "an MPS daemon's control pipe exists ($pipe/control)"
    return 0
  fi
  return 1
}

# sanitizer_refusal: when compute-sanitizer cannot run a CUDA program on this machine's GPU, prints
# why and returns 0; else returns 1. Some container runtimes refuse the device ("Device not
# supported", then error 999 at the first allocation): that says nothing about mhc_sp's kernels,
# so memcheck is then skipped with the tool's own line, not failed. A tiny allocation and a copy
# under the tool, nothing of mhc_sp.
sanitizer_refusal() {
  local out rc
  out=$(timeout --kill-after=5 60 compute-sanitizer --tool memcheck --error-exitcode 3 "$PY" -c \
    'import torch; x = torch.ones(4, device="cuda"); assert float(x.sum().cpu()) == 4.0' 2>&1)
  rc=$?
  if ((rc == 0)); then
    return 1
  fi
  local line
  line=$(grep -m1 -iE "not supported|error [0-9]+|Error:" <<<"$out")
  echo "compute-sanitizer cannot run a CUDA program on this GPU (rc=$rc): ${line:-$(tail -1 <<<"$out")}"
  return 0
}

# gpu_count: the GPUs the tests can use (CUDA_VISIBLE_DEVICES when set, else nvidia-smi's list).
gpu_count() {
  if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then
    local -a ids
    IFS=, read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
    local n=0 id
    for id in "${ids[@]}"; do [[ -n $id ]] && ((n += 1)); done
    echo "$n"
  else
    nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
  fi
}

log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

skip() { # name reason
  log "=== $1: skipped ($2)"
  "$PY" "$SUMMARY_PY" skip "$STEPS_FILE" --name "$1" --reason "$2" >/dev/null
}

# step NAME LIMIT CMD...: runs CMD under a timeout (never past the script's total budget), output
# to the log and the terminal; records status, rc, seconds and, for pytest steps (a junit file in
# $WORK/NAME.xml), the test counts and the failed and skipped tests. Returns 0 when the step's
# status is ok or partial.
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
  local dt=$((SECONDS - t0)) status
  local junit=()
  [[ -f $WORK/$name.xml ]] && junit=(--junit "$WORK/$name.xml")
  status=$("$PY" "$SUMMARY_PY" record "$STEPS_FILE" --name "$name" --rc "$rc" --seconds "$dt" \
    --limit "$limit" --gpus "$GPUS" "${junit[@]}")
  log "=== $name: ${status:-unrecorded} (rc=$rc, ${dt}s)"
  [[ $status == ok || $status == partial ]]
}

pytest_step() { # name limit test files...
  local name=$1 limit=$2
  shift 2
  # The tests' output goes into the junit file too: lines starting "record: " reach the summary.
  step "$name" "$limit" "$PY" -m pytest -q -ra --junitxml="$WORK/$name.xml" \
    -o junit_logging=system-out "$@"
}

write_summary() {
  local gpu
  ((SUMMARY_WRITTEN)) && return 0
  SUMMARY_WRITTEN=1
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  local IFS=,
  "$PY" "$SUMMARY_PY" verdict "$STEPS_FILE" "$SUMMARY" --host "$(hostname)" --gpu "$gpu" \
    --gpus "$GPUS" --seconds "$SECONDS" --selection "${SELECTED[*]}" | tee -a "$LOG"
  [[ ${PIPESTATUS[0]} == 0 ]] && RUN_OK=1
  # What comes back is at most 16 MiB a file.
  [[ $(stat -c %s "$LOG") -gt 15000000 ]] && truncate -s 15000000 "$LOG"
  rm -rf "$WORK"
  log "summary: $SUMMARY"
}

# The build, then what each translation unit cost (from the ninja log the build wrote, the CUDA
# units counted as CMakeLists.txt made them) in $OUT/build_times.json, for the next estimate.
run_build() {
  local ok=0 ninja_log
  touch "$WORK/build.start"
  step build "$T_BUILD" "$PY" setup.py build_ext --inplace || ok=1
  ninja_log=$(find build -mindepth 2 -maxdepth 2 -path 'build/cmake-*-cuda/.ninja_log' \
    -newer "$WORK/build.start" 2>/dev/null | head -1)
  if [[ -n $ninja_log ]]; then
    "$PY" bench/build_times.py "$ninja_log" --cores "$(nproc)" --top 8 \
      --json "$OUT/build_times.json" 2>&1 | tee -a "$LOG"
  fi
  return $ok
}

run_build_info() {
  step build_info "$T_INFO" "$PY" -c '
import torch, mhc_sp
info = mhc_sp.build_info()
for k, v in sorted(info.items()):
    print(f"{k}: {v}")
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("nccl (torch):", ".".join(map(str, torch.cuda.nccl.version())))
assert info["cuda"], "extension built without CUDA"
'
}

run_cubin_gate() {
  pytest_step cubin_gate "$T_GATE" tests/cuda/test_cubins.py
}

run_cuda_tests() {
  pytest_step cuda_tests "$T_TESTS" tests/cuda/test_cuda_ops.py \
    tests/cuda/test_cuda_invariance.py tests/cuda/test_nccl.py tests/cuda/test_cuda_vs_emulation.py
}

run_symm_sim() {
  pytest_step symm_sim "$T_SIM" tests/cuda/test_cuda_symm.py
}

run_symm_world() {
  local why
  if why=$(mps_daemon); then
    skip symm_world "$why: the two ranks' kernels would share the GPU's SMs, and one rank's \
spinning blocks could fill it; stop the daemon to run this step"
    return 0
  fi
  pytest_step symm_world "$T_WORLD" tests/cuda/test_cuda_symm_world.py
}

# memcheck: small shapes through every op and both pre paths (fused <= 16 tokens, two kernels
# above; vector and scalar hidden sizes), and the symm kernels (decode and sharded, production
# launch and two simulated ranks). Only mhc_sp's kernels are instrumented (--kernel-name: the
# names all hold "mhc_sp"), so torch's own launches run at full speed; API errors are not reported
# (--report-api-errors no: torch probes the driver with calls that fail on purpose), so the exit
# status 3 means a memory error in a checked kernel (memcpy and memset calls are still checked
# against their allocations, the default). Without the caching allocator every tensor is its own
# allocation and an access past its end is caught. The warm-up (imports, CUDA start, the inputs)
# comes first and is timed apart from the checked region.
run_memcheck() {
  local why
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    skip memcheck "compute-sanitizer not found"
    return 0
  fi
  if why=$(sanitizer_refusal); then
    skip memcheck "$why"
    return 0
  fi
  step memcheck "$T_SANITIZER" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer \
    --tool memcheck --kernel-name kns=mhc_sp --report-api-errors no --error-exitcode 3 \
    "$PY" -c '
import time
t0 = time.monotonic()
import torch
from mhc_sp import _C, _testing
from mhc_sp import reference as R
from mhc_sp.config import MhcConfig
from mhc_sp.testing import OPS, pre_weights, random_inputs
torch.cuda.init()
shapes = [(3, 4, 256), (70, 4, 72), (5, 2, 33)]
op_inputs = [random_inputs(T, n, H, seed=1, device="cuda") for T, n, H in shapes]
C = _C.symm_constants()
cfg = MhcConfig().scalars()
symm_inputs = {T: random_inputs(T, 4, 256, seed=2, device="cuda") for T in (3, 5)}
torch.cuda.synchronize()
t1 = time.monotonic()
print(f"warm-up {t1 - t0:.1f} s", flush=True)
for i in op_inputs:
    for info in OPS.values():
        info.call(info.sample(i))
for tp, production in ((1, True), (2, False)):
    sim = _testing.SymmSimGroup(tp, 0, C["default_mailbox_slot_bytes"], 1 << 22, 30.0)
    for T, sharded in ((3, False), (5, True)):
        i = symm_inputs[T]
        parts = [torch.randn(T, 256, device="cuda").bfloat16() for _ in range(tp)]
        own = lambda t, r: R.shard_tokens(t, r, tp).contiguous() if sharded else t
        rows = [[own(i[k], r) for r in range(tp)] for k in ("residual", "post", "comb")]
        sim.fused_layer(parts, *rows, *pre_weights(i), sharded, T, *cfg, production=production)
    xs = [torch.randn(3, 256, device="cuda").bfloat16() for _ in range(tp)]
    sim.collective("all_reduce", xs, production=production)
    assert all(e is None for e in sim.errors()), sim.errors()
torch.cuda.synchronize()
print(f"checked region {time.monotonic() - t1:.1f} s: memcheck run complete")
'
}

# Timings last: the symm boundaries beside their rooflines, then the op benchmark (the V4-Pro
# hidden size against the eager reference; the full sweep, compiled baseline included, is
#   python -m mhc_sp.bench ops --device cuda --tokens 1,16,256,4096,16384 \
#     --hidden-size 4096,7168 --json F).
run_symm_timings() {
  step symm_timings "$T_TIMING" "$PY" bench/symm_harness.py --json "$OUT/symm_harness.json" \
    --budget-s $((T_TIMING - 10))
}

run_op_bench() {
  step op_bench "$T_BENCH" "$PY" -m mhc_sp.bench ops --device cuda --json "$OUT/bench.json" \
    --budget-s $((T_BENCH - 12)) --hidden-size 7168 --tokens 1,16,4096,16384 --compare eager \
    --repeats 10
}

main() {
  local rc=0
  parse_args "$@" || rc=$?
  ((rc == 1)) && exit 0
  ((rc != 0)) && exit 2
  cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
  ROOT=$(pwd)
  OUT=${OUT:-$ROOT/bench/out}
  mkdir -p "$OUT"
  LOG=$OUT/gpu_check.log
  SUMMARY=$OUT/summary.json
  WORK=$(mktemp -d)
  STEPS_FILE=$WORK/steps.jsonl
  SUMMARY_PY=$ROOT/bench/gpu_check_summary.py
  PY=${PYTHON:-$(command -v python3 || command -v python)}
  : >"$LOG"

  # Per-step limits in seconds (override from the environment): about twice each step's estimate
  # in the header, so that a slower machine still finishes. T_TOTAL bounds the whole run, so that
  # the summary is written within ten minutes whatever the steps do.
  T_BUILD=${T_BUILD:-200}
  T_INFO=${T_INFO:-30}
  T_GATE=${T_GATE:-30}
  T_TESTS=${T_TESTS:-150}
  T_SIM=${T_SIM:-60}
  T_WORLD=${T_WORLD:-150}
  T_SANITIZER=${T_SANITIZER:-120}
  T_TIMING=${T_TIMING:-30}
  T_BENCH=${T_BENCH:-30}
  T_TOTAL=${T_TOTAL:-570}

  export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONUNBUFFERED=1
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  export PATH=$CUDA_HOME/bin:$PATH
  export MHC_SP_CUDA=1
  export MHC_SP_TESTING=1 # the simulated symm ranks (mhc_sp._testing) the checks below run
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
  export MAX_JOBS=${MAX_JOBS:-$(nproc)}
  GPUS=$(gpu_count)
  trap write_summary EXIT

  log "root $ROOT, out $OUT, steps: ${SELECTED[*]}"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 |
      tee -a "$LOG"
  else
    log "nvidia-smi not found"
  fi
  nvcc --version 2>&1 | tail -2 | tee -a "$LOG"

  local s
  for s in "${SELECTED[@]}"; do
    if [[ $s != build && $BUILD_FAILED == 1 ]]; then
      skip "$s" "the build failed"
      continue
    fi
    if ! "run_$s" && [[ $s == build ]]; then
      BUILD_FAILED=1
    fi
  done
  write_summary
  # The exit status says what the summary says: 0 only when every step run is ok.
  ((RUN_OK)) && exit 0
  exit 1
}

BUILD_FAILED=0
SUMMARY_WRITTEN=0
RUN_OK=0
SELECTED=()
# Sourced (the tests call parse_args and mps_daemon): define the functions only.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  main "$@"
fi
