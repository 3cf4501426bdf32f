# SPDX-License-Identifier: Apache-2.0
"""What mhc_sp's NVTX ranges cost: decode-size op calls, timed in one long-lived process per
variant, in short bursts that take turns (a burst of each variant, then again, who goes first
rotating), so that a shared machine's load changes hit every variant alike. A sample's ratio is
the median of its neighbouring bursts' ratios; fresh processes make each sample, and the median of
the samples' ratios is kept (a process that lands on a busier core stays there):

* ``no tool``: the normal build, no NVTX tool attached (each range is a call through a null
  function pointer, and the phases' torch.profiler scope finds no callback);
* ``recorder``: the same build with the recording NVTX tool attached (NVTX_INJECTION64_PATH set),
  which records every range: an upper bound for what the ranges themselves cost;
* ``no NVTX`` (with ``--nvtx-off DIR``): a build made with MHC_SP_NVTX=0, whose NVTX ranges
  compile to nothing (DIR: the python/ folder of that build, put first on PYTHONPATH).

Ops: mhc_post_pre (one op range) and fused_layer on a world of one (its op range and phase
ranges), 4 tokens, hidden 4096, hc_mult 4, one thread; and an empty NVTX range pushed and popped
from Python (``mhc_sp._C.nvtx_push`` / ``nvtx_pop``, what ``profiling.phase`` calls), where the
``no NVTX`` variant leaves the Python binding's cost alone: the difference is one range's.

    .venv/bin/python bench/nvtx_overhead.py --nvtx-off build/nvtx-off/python \\
        --json bench/results/cpu_nvtx_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

OPS = ("mhc_post_pre", "fused_layer", "phase")
T, N, H = 4, 4, 4096
#: Calls per burst: the ops take ~0.1 ms, an empty phase well under 1 us.
BURST = {"mhc_post_pre": 20, "fused_layer": 20, "phase": 20000}


def worker(op: str) -> None:
    """Serve bursts: for each line on stdin, time ``burst`` calls of ``op`` and print the seconds
    per call."""
    import torch

    import mhc_sp.distributed as msd
    from mhc_sp import build_info, ops
    from mhc_sp.testing import pre_weights, random_inputs

    torch.set_num_threads(1)
    burst = BURST[op]
    i = random_inputs(T, N, H)
    if op == "phase":
        from mhc_sp import _C

        def call():
            _C.nvtx_push("mhc_sp/bench")
            _C.nvtx_pop()

    elif op == "mhc_post_pre":

        def call():
            return ops.mhc_post_pre(i["x"], i["residual"], i["post"], i["comb"], *pre_weights(i))

    else:
        group = msd.init(None, device="cpu")

        def call():
            return ops.fused_layer(
                i["x"], i["residual"], i["post"], i["comb"], *pre_weights(i), group, True, T
            )

    for _ in range(3 * burst):
        call()
    print(json.dumps({"nvtx": build_info()["nvtx"]}), flush=True)
    for _ in sys.stdin:
        start = time.perf_counter()
        for _ in range(burst):
            call()
        print((time.perf_counter() - start) / burst, flush=True)


def p10(values: list[float]) -> float:
    return sorted(values)[len(values) // 10]


def sample(op: str, variants: dict, bursts: int) -> dict[str, list[float]]:
    """Seconds per call of each burst, per variant, from one fresh worker per variant; the
    variants take turns burst by burst, who goes first rotating (the first of a round runs on a
    machine that the parent's wake-up has just disturbed)."""
    procs = {}
    for name, env in variants.items():
        argv = [sys.executable, __file__, "--worker", op]
        procs[name] = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
    for name, proc in procs.items():
        nvtx = json.loads(proc.stdout.readline())["nvtx"]
        if nvtx != (name != "no NVTX"):
            raise SystemExit(f"{name}: the worker's build has nvtx={nvtx}")
    times = {name: [] for name in variants}
    names = list(procs)
    for b in range(bursts):
        for name in names[b % len(names) :] + names[: b % len(names)]:
            proc = procs[name]
            proc.stdin.write("\n")
            proc.stdin.flush()
            times[name].append(float(proc.stdout.readline()))
    for proc in procs.values():
        proc.stdin.close()
        proc.wait(timeout=60)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5, help="fresh sets of workers per op")
    parser.add_argument("--bursts", type=int, default=200, help="bursts per variant and sample")
    parser.add_argument("--nvtx-off", help="python/ folder of a build made with MHC_SP_NVTX=0")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--worker", choices=OPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return

    from mhc_sp import profiling

    base = {k: v for k, v in os.environ.items() if k != profiling.NVTX_INJECTION_VAR}
    variants = {
        "no tool": base,
        "recorder": dict(
            base, **{profiling.NVTX_INJECTION_VAR: str(profiling.nvtx_recorder_library())}
        ),
    }
    if args.nvtx_off:
        path = os.pathsep.join([os.path.abspath(args.nvtx_off), base.get("PYTHONPATH", "")])
        variants["no NVTX"] = dict(base, PYTHONPATH=path)
    rows = []
    for op in OPS:
        # Fresh workers for every sample: a process that happens to land on a busier core stays
        # there, so each sample's ratio is its own processes', and the samples' median is kept.
        times = {name: [] for name in variants}
        sample_ratios = {name: [] for name in variants if name != "no tool"}
        for _ in range(args.samples):
            got = sample(op, variants, args.bursts)
            for name, t in got.items():
                times[name] += t
            for name in sample_ratios:
                ratios = [a / b for a, b in zip(got[name], got["no tool"])]
                sample_ratios[name].append(statistics.median(ratios))
        row = {"op": op, "tokens": T, "hidden": H, "hc_mult": N, "threads": 1}
        row["calls_per_burst"] = BURST[op]
        row.update({f"{v} us": round(statistics.median(t) * 1e6, 4) for v, t in times.items()})
        for v, ratios in sample_ratios.items():
            row[f"{v} / no tool"] = round(statistics.median(ratios), 4)
            row[f"{v} / no tool, per sample"] = [round(r, 4) for r in ratios]
            # The fastest tenth of each variant's bursts: the least disturbed by other jobs.
            row[f"{v} - no tool, p10, ns per call"] = round(
                (p10(times[v]) - p10(times["no tool"])) * 1e9, 1
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        command = "python bench/nvtx_overhead.py " + " ".join(sys.argv[1:])
        doc = {
            "command": command,
            "samples": args.samples,
            "bursts_per_sample": args.bursts,
            "load_average": os.getloadavg()[0],
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
