#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The tuner's stability: five identical runs of one tuner command, one after the other, folded
# into one record per command, bench/results/cpu_stability_NAME.json (docs/benchmarks.md quotes
# them; tests/repo/test_readme.py checks the quotes against them).
#   bash bench/tune_stability.sh NAME...  NAME: h1024_tp2 h4096_tp2 h1024_tp3 h4096_tp3 bare, or all
#   bash bench/tune_stability.sh table    docs/benchmarks.md's table of the records: answers, load, wall
# A record is run 1's --json document (what `mhc-sp-bench show` prints) with every run's document
# in `runs`, each with /proc/loadavg read just before it started (`load_before`; the document's
# own load_average is read at its end) and its wall time. The machine may be shared: the load
# says how busy it was, and the answers must hold all the same.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-.venv/bin/mhc-sp-bench}
PY=${PY:-.venv/bin/python}
R=bench/results
RUNS=${RUNS:-5}
args_of() {  # the tuner command of each record
  case $1 in
    h1024_tp2) echo "tune -tp 2 --hidden-size 1024" ;;
    h4096_tp2) echo "tune -tp 2 --hidden-size 4096" ;;
    h1024_tp3) echo "tune -tp 3 --hidden-size 1024" ;;
    h4096_tp3) echo "tune -tp 3 --hidden-size 4096" ;;
    bare) echo "" ;;
    *) echo "tune_stability.sh: unknown record '$1' (h1024_tp2 h4096_tp2 h1024_tp3 h4096_tp3 bare all table)" >&2; exit 2 ;;
  esac
}
record() {  # record NAME: RUNS runs of its command, folded into one file
  local name=$1 args out runs
  args=$(args_of "$name")
  out=$R/cpu_stability_$name.json
  runs=$(mktemp -d)
  trap 'rm -rf "$runs"' RETURN
  for k in $(seq 1 "$RUNS"); do
    cut -d' ' -f1-3 /proc/loadavg > "$runs/$k.load"
    local start end
    start=$(date +%s.%N)
    # shellcheck disable=SC2086  # the command's words
    timeout 600 $BENCH $args --json "$out" > /dev/null
    end=$(date +%s.%N)
    echo "$start $end" > "$runs/$k.time"
    cp "$out" "$runs/$k.json"
    echo "$name run $k: $(cat "$runs/$k.load") -> $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["recommended_sp_threshold"])' "$runs/$k.json")" >&2
  done
  "$PY" - "$runs" "$RUNS" "$out" "$name" <<'PY'
import json, os, sys
runs, n, out, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
docs = []
for k in range(1, n + 1):
    doc = json.load(open(os.path.join(runs, f"{k}.json")))
    start, end = map(float, open(os.path.join(runs, f"{k}.time")).read().split())
    load = [float(v) for v in open(os.path.join(runs, f"{k}.load")).read().split()]
    docs.append({"run": k, "load_before": load, "wall_s": round(end - start, 2), **doc})
record = {k: v for k, v in docs[0].items() if k not in ("run", "load_before", "wall_s")}
record["stability"] = {
    "script": f"bash bench/tune_stability.sh {name}",
    "about": "the top level is run 1's document; runs holds every run's, one after the other",
    "recommended_sp_thresholds": [d["recommended_sp_threshold"] for d in docs],
}
record["runs"] = docs
json.dump(record, open(out, "w"), indent=1)
PY
}
table() {  # docs/benchmarks.md's table: one row per record made by this script
  "$PY" - "$R" <<'PY'
import json, os, re, sys
print("| record | command | recommended, runs 1-5 | same cost, runs 1-5 | load before, 1 min | wall, s |")
print("|---|---|---|---|---|---|")
for record in ("h1024_tp2", "h4096_tp2", "h1024_tp3", "h4096_tp3", "bare"):
    name = f"cpu_stability_{record}.json"
    runs = json.load(open(os.path.join(sys.argv[1], name)))["runs"]
    command = re.sub(r"^mhc-sp-bench | --json \S+$", "", runs[0]["command"])
    cells = [
        " ".join(str(r["recommended_sp_threshold"]) for r in runs),
        " ".join("{}-{}".format(*r["same_cost_sp_thresholds"]) for r in runs),
        " ".join(f"{r['load_before'][0]:.1f}" for r in runs),
        " ".join(f"{r['wall_s']:.0f}" for r in runs),
    ]
    print(f"| `{name}` | `{command}` | " + " | ".join(cells) + " |")
PY
}
[ $# -gt 0 ] || { echo "usage: bash bench/tune_stability.sh NAME...|all|table" >&2; exit 2; }
for name in "$@"; do
  case $name in
    all) for n in h1024_tp2 h4096_tp2 h1024_tp3 h4096_tp3 bare; do record "$n"; done ;;
    table) table ;;
    *) record "$name" ;;
  esac
done
