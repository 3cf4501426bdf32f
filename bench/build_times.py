# SPDX-License-Identifier: Apache-2.0
"""What a build's translation units cost, read from its ninja log, and the wall time the same
build would take on another core count: the numbers behind bench/gpu_check.sh's build estimate.

    python bench/build_times.py build/cmake-cpython-311-cuda/.ninja_log --cores 16 [--top N]
        [--json F]

Reads the last build recorded in the log that compiled anything (each ninja run appends its
entries, in the order they finish, with times from the run's own start). A translation unit's
time is its compile job's wall time; with no more jobs than cores (MAX_JOBS <= nproc) that is
the time it takes one core. The estimate for N cores schedules the same jobs, longest first, on
N cores (compiles do not share inputs, so they only wait for a free core), then adds the links,
which wait for every object: a lower bound that a loaded or slower machine exceeds."""

from __future__ import annotations

import argparse
import heapq
import json
import sys


def read_last_run(path: str) -> list[tuple[int, int, str]]:
    """(start ms, end ms, output) of every job of the log's last ninja run that compiled anything
    (a run with nothing to do records only its checks)."""
    runs, current, last_end = [], [], -1
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 4:
                continue
            start, end, output = int(parts[0]), int(parts[1]), parts[3]
            if end < last_end:  # a new run: its times start again from zero
                runs.append(current)
                current = []
            current.append((start, end, output))
            last_end = end
    runs.append(current)
    compiled = [run for run in runs if any(kind(out) in ("cuda", "cxx") for _, _, out in run)]
    return compiled[-1] if compiled else []


def kind(output: str) -> str:
    if output.endswith(".cu.o"):
        return "cuda"
    if output.endswith(".o"):
        return "cxx"
    if output.endswith(".so") or ".so" in output.rsplit("/", 1)[-1]:
        return "link"
    return "other"


def schedule(seconds: list[float], cores: int) -> float:
    """Wall time of `seconds` jobs on `cores` cores, longest job first onto the first free core."""
    free = [0.0] * max(cores, 1)
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(free, free[0] + s)
    return max(free)


def summarise(jobs: list[tuple[int, int, str]], cores: int) -> dict:
    units = [
        {"output": out, "kind": kind(out), "seconds": round((end - start) / 1000, 1)}
        for start, end, out in jobs
        if kind(out) in ("cuda", "cxx", "link")
    ]
    units.sort(key=lambda u: -u["seconds"])
    compiles = [u["seconds"] for u in units if u["kind"] != "link"]
    links = [u["seconds"] for u in units if u["kind"] == "link"]
    return {
        "wall_s": round((max(e for _, e, _ in jobs) - min(s for s, _, _ in jobs)) / 1000, 1),
        "cuda_units": sum(u["kind"] == "cuda" for u in units),
        "cxx_units": sum(u["kind"] == "cxx" for u in units),
        "compile_s_total": round(sum(compiles), 1),
        "longest": units[0] if units else None,
        "cores": cores,
        "estimate_s": round(schedule(compiles, cores) + max(links, default=0.0), 1),
        "units": units,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ninja_log")
    p.add_argument("--cores", type=int, default=16, help="cores of the machine to estimate for")
    p.add_argument("--top", type=int, default=0, help="list only the N longest units")
    p.add_argument("--json", help="write the summary here")
    a = p.parse_args(argv)
    if a.cores < 1:
        print(f"--cores: expected at least 1, got {a.cores}", file=sys.stderr)
        return 2
    try:
        jobs = read_last_run(a.ninja_log)
    except OSError as e:
        print(f"ninja_log: cannot read {a.ninja_log}: {e.strerror}", file=sys.stderr)
        return 2
    if not jobs:
        print(f"ninja_log: no build recorded in {a.ninja_log}", file=sys.stderr)
        return 2
    s = summarise(jobs, a.cores)
    for u in s["units"][: a.top] if a.top > 0 else s["units"]:
        print(f"{u['seconds']:8.1f} s  {u['kind']:5s} {u['output']}")
    print(
        f"{s['cuda_units']} CUDA and {s['cxx_units']} C++ translation units, "
        f"{s['compile_s_total']} s of compiles (wall {s['wall_s']} s here); "
        f"on {a.cores} cores about {s['estimate_s']} s"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(s, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
