#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job's stability: five identical runs of `mhc-sp-bench tune -tp 2 --hidden-size 1024`
# (`bash bench/tune_stability.sh tune`) and five of the bare `mhc-sp-bench` (`... bare`), each
# recorded with its command and wall time; `... summary` then gathers the ten recommendations,
# bands, wall times and load averages, and the machine (lscpu's model name), into
# bench/results/cpu_stability.json (docs/benchmarks.md quotes it). Run each set on a quiet
# machine: the times of a run that waits for a core are not this machine's.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-.venv/bin/mhc-sp-bench}
R=bench/results
mkdir -p "$R"
run() {  # run NAME ARGS...: one run, its --json and its wall time
  local name=$1
  shift
  local start end
  start=$(date +%s.%N)
  $BENCH "$@" --json "$R/$name.json" >/dev/null
  end=$(date +%s.%N)
  .venv/bin/python - "$R/$name.json" "$start" "$end" <<'PY'
import json, sys
path, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
doc = json.load(open(path))
doc["wall_s"] = round(end - start, 2)
json.dump(doc, open(path, "w"), indent=1)
PY
}
case "${1:-}" in
  tune) for k in 1 2 3 4 5; do run "cpu_stability_tune_h1024_run$k" tune -tp 2 --hidden-size 1024; done ;;
  bare) for k in 1 2 3 4 5; do run "cpu_stability_bare_run$k"; done ;;
  summary)
    lscpu | sed -n 's/^Model name: *//p' | head -1 > "$R/.cpu_model"
    .venv/bin/python - "$R" <<'PY'
import glob, json, os, sys
R = sys.argv[1]
model = open(os.path.join(R, ".cpu_model")).read().strip()
os.remove(os.path.join(R, ".cpu_model"))
runs = []
for path in sorted(glob.glob(os.path.join(R, "cpu_stability_*_run*.json"))):
    doc = json.load(open(path))
    runs.append({
        "file": os.path.relpath(path),
        "command": doc["command"],
        "wall_s": doc.get("wall_s"),
        "load_average": doc["environment"].get("load_average"),
        "recommended_sp_threshold": doc["recommended_sp_threshold"],
        "band_tokens": doc.get("band_tokens"),
        "speedup_x": {r["tokens"]: round(r["speedup_x"], 3) for r in doc["rows"]},
    })
out = {"machine": model, "command": "bash bench/tune_stability.sh tune; bash bench/tune_stability.sh bare", "runs": runs}
json.dump(out, open(os.path.join(R, "cpu_stability.json"), "w"), indent=1)
for r in runs:
    print(r["file"], r["recommended_sp_threshold"], r["band_tokens"], r["wall_s"], r["load_average"])
PY
    ;;
  *) echo "usage: bash bench/tune_stability.sh tune|bare|summary" >&2; exit 2 ;;
esac
