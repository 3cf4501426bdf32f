#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The C++ code under sanitizers. Builds mhc_sp with MHC_SP_SANITIZE (CPU only, the test-only
# modules included) into build/sanitize-<sanitizers>/site (its own build folder; the normal build
# and .venv's editable install are left alone), runs tests with that copy first on the path and the
# sanitizer's runtime preloaded (the Python interpreter is not built with it, so it must come first,
# and libstdc++ with it, whose __cxa_throw ASan must find when it starts), and counts the reports.
#   bash scripts/sanitize.sh [OUT]             AddressSanitizer + UndefinedBehaviorSanitizer: the op
#                                              tests, bad inputs, the shm transport (worlds 2-4,
#                                              injected faults) and the emulated device's tests
#   MHC_SP_SANITIZE=thread bash scripts/sanitize.sh [OUT]
#                                              ThreadSanitizer: the emulated symm tests (the
#                                              barrier exchange, the Lamport mailbox, the failure
#                                              paths) and the math ops'
#                                              cross-block paths (split-K partials, the fused
#                                              decode's last block), every atomic at the order the
#                                              device code writes (docs/emulation.md); CI runs it
# Writes a JSON summary (default bench/results/sanitize.json, sanitize_thread.json); exits 1 on any
# report or failed test. Needs .venv (scripts/bootstrap.sh). About 10 minutes on 2 cores each.
set -euo pipefail
cd "$(dirname "$0")/.."
export MHC_SP_SANITIZE=${MHC_SP_SANITIZE:-address,undefined}
export MHC_SP_CUDA=0 MHC_SP_TESTING=1
if [ "$MHC_SP_SANITIZE" = thread ]; then
  OUT=${1:-bench/results/sanitize_thread.json}
else
  OUT=${1:-bench/results/sanitize.json}
fi
SAN=build/sanitize-${MHC_SP_SANITIZE//,/-}
SITE=$SAN/site
LOGS=$SAN/logs
started=$(date +%s)
MAX_JOBS=${MAX_JOBS:-$(nproc)} .venv/bin/python -m pip install -q --no-build-isolation --no-deps \
  --upgrade --target "$SITE" . 2>&1 | grep -v "^WARNING: Location" || true
test -d "$SITE/mhc_sp" || { echo "sanitize.sh: the sanitized build failed" >&2; exit 1; }
built=$(date +%s)

rm -rf "$LOGS" && mkdir -p "$LOGS"
if [ "$MHC_SP_SANITIZE" = thread ]; then
  # ignore_noninstrumented_modules: torch's and the interpreter's own threads are not this code's.
  export TSAN_OPTIONS="log_path=$PWD/$LOGS/tsan:ignore_noninstrumented_modules=1:report_signal_unsafe=0:second_deadlock_stack=1"
  # ThreadSanitizer tracks every emulated thread (fiber) as a thread, which costs: the two-rank
  # cases of the barrier exchange and the Lamport mailbox (fifteen calls in a row: every mailbox
  # and half reused), the call order and the failure paths; of the math ops, the shapes whose
  # blocks hand partial sums to another block (the fused decode's last block, split-K over many
  # chunks). Not the tp 3-8 sweeps (CI's budget), nor the run-ahead tests, whose assertion that a
  # rank got ahead depends on the host's timing, which ThreadSanitizer's slowness changes. The GPU
  # harness's kernels: its two-rank boundaries.
  TESTS=(tests/emulated/test_emulated_symm.py tests/emulated/test_emulated_ops.py
    tests/emulated/test_emulated_symm_sim.py)
  SELECT="(in_a_row and 2) or take_the_kernels or (collectives and 2) or mismatch or plans"
  SELECT="$SELECT or broken or every_symm_call or two_host_threads or (symm_sim and fused_layer and 2)"
  SELECT="$SELECT or (matches_reference and ((mhc_post_pre and decode) or (mhc_pre and split)))"
  export PRELOAD="$(gcc -print-file-name=libtsan.so) $(gcc -print-file-name=libstdc++.so)"
else
  # detect_leaks=0: the interpreter and torch keep memory until exit by design; the rest stays on.
  # alloc_dealloc_mismatch=0: libtorch's own new/delete pairs, not this code's.
  export ASAN_OPTIONS="detect_leaks=0:alloc_dealloc_mismatch=0:log_path=$PWD/$LOGS/asan"
  export UBSAN_OPTIONS="print_stacktrace=1:log_path=$PWD/$LOGS/ubsan"
  TESTS=(tests/ops/test_mhc_ops.py tests/ops/test_bad_inputs.py tests/transport/test_shm.py
    tests/transport/test_sp_ops.py tests/transport/test_faults.py tests/emulated)
  # torch.compile's own compiler processes would inherit the preload: the compiled-boundary test
  # is left to the normal build.
  SELECT="not compiled_boundary and not world8"
  export PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
fi
set +e
LD_PRELOAD="$PRELOAD" PYTHONPATH="$SITE" \
  .venv/bin/python -c "import mhc_sp, sys; sys.exit(0 if '$SITE' in mhc_sp.__file__ else 1)"
first=$?
LD_PRELOAD="$PRELOAD" PYTHONPATH="$SITE" \
  .venv/bin/python -m pytest -q -p no:cacheprovider "${TESTS[@]}" -k "$SELECT" \
  2>&1 | tee "$SAN/pytest.log"
status=${PIPESTATUS[0]}
set -e
finished=$(date +%s)
[ "$first" -eq 0 ] || { echo "sanitize.sh: the tests did not import the sanitized build" >&2; exit 1; }

.venv/bin/python - "$OUT" "$LOGS" "$SAN/pytest.log" "$status" "$((built - started))" \
  "$((finished - built))" "${TESTS[*]}" "$SELECT" <<'EOF'
import json, os, pathlib, re, subprocess, sys
out, logs, log, status, build_s, test_s, tests, select = sys.argv[1:]
kinds = {"asan": "address", "ubsan": "undefined", "tsan": "thread"}
reports = {kinds[k]: [] for k in kinds if kinds[k] in os.environ["MHC_SP_SANITIZE"].split(",")}
pattern = r"ERROR: AddressSanitizer|Sanitizer: CHECK failed|runtime error:|WARNING: ThreadSanitizer"
for path in sorted(pathlib.Path(logs).glob("*")):
    text = path.read_text(errors="replace")
    kind = kinds[path.name.split(".")[0]]
    reports.setdefault(kind, [])
    reports[kind] += [line for line in text.splitlines() if re.search(pattern, line)]
summary = [l for l in pathlib.Path(log).read_text().splitlines() if re.search(r"\d+ (passed|failed)", l)]
doc = {
    "kind": "sanitize",
    "command": ("MHC_SP_SANITIZE=thread " if os.environ["MHC_SP_SANITIZE"] == "thread" else "")
    + "bash scripts/sanitize.sh",
    "sanitizers": os.environ["MHC_SP_SANITIZE"],
    "compiler": subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
    "tests": tests.split(),
    "selection": select,
    "preload": os.environ.get("PRELOAD", ""),
    "pytest_exit": int(status),
    "pytest_summary": summary[-1] if summary else None,
    "errors": {k: len(v) for k, v in reports.items()},
    "reports": {k: v[:20] for k, v in reports.items()},
    "build_s": int(build_s),
    "tests_s": int(test_s),
    "load_average_at_end": os.getloadavg(),
}
pathlib.Path(out).write_text(json.dumps(doc, indent=2) + "\n")
print(f"sanitize: {doc['errors']} sanitizer reports; pytest: {doc['pytest_summary']} -> {out}")
sys.exit(0 if status == "0" and not any(reports.values()) else 1)
EOF
