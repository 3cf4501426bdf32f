# SPDX-License-Identifier: Apache-2.0
"""Detection times of injected faults over the shm transport, many times over: ranks loop
fused_layer (16 tokens, H=256, msd.init timeout 5 s) and one of them is killed at a random moment
of the loop (a fresh world each time), or stopped (SIGSTOP, SIGCONT once every peer raised), or
calls with another token count or op, or never calls (several of these in one world, init again
between them). Records, per fault and world size, the seconds from the fault to each rank's
error (median, p90, max), what each rank raised (messages with rank numbers and pids masked),
whether a stopped rank wrote into its abandoned segment, and anything left in /dev/shm.

    .venv/bin/python -m tests.transport.fault_loop --json bench/results/faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from mhc_sp.local_world import run_world
from tests.helpers import faults as F

#: How this check is run, from the repository root (its record's "command").
COMMAND = ("python", "-m", "tests.transport.fault_loop")


def masked(message: str | None) -> str | None:
    if message is None:
        return None
    message = re.sub(r"\brank \d+", "rank N", message)
    message = re.sub(r"\bpid \d+", "pid P", message)
    return re.sub(r"\bcall \d+", "call C", message)


def run(world: int, plan: list, timeout: float = 300) -> tuple[list, list[str]]:
    """Runs one world over `plan`; returns each step's reports and what is left in /dev/shm."""
    with tempfile.TemporaryDirectory() as sync:
        killed = {v for f, v, _ in plan if f == "kill"}
        results = run_world(
            world, F.worker, plan, sync, expect_exit=killed, timeout=timeout, start="forkserver"
        )
        names = {n for r in results if r for n in r["segments"]}
        reports = [F.read_reports(sync, k, world) for k in range(len(plan))]
    return reports, F.leftover_segments(names)


def summarise(steps: list[dict]) -> dict:
    survivors = [s for step in steps for rank, s in step["ranks"].items() if rank != step["victim"]]
    victims = [step["ranks"].get(step["victim"]) for step in steps]
    seconds = sorted(s["seconds"] for s in survivors if s["seconds"] is not None)

    def stats(values):
        if not values:
            return None
        return {
            "n": len(values),
            "median": statistics.median(values),
            "p90": values[int(0.9 * (len(values) - 1))],
            "max": values[-1],
        }

    naming = sum(
        bool(re.search(rf"\brank {step['victim']}\b", s["message"] or ""))
        for step in steps
        for rank, s in step["ranks"].items()
        if rank != step["victim"]
    )
    return {
        "iterations": len(steps),
        "survivors_naming_the_faulty_rank": f"{naming} of {len(survivors)}",
        "survivor_detection_s": stats(seconds),
        "survivors_without_error": sum(s["seconds"] is None for s in survivors),
        "victim_detection_s": stats(
            sorted(v["seconds"] for v in victims if v and v["seconds"] is not None)
        ),
        "raised": Counter(f"{s['type']}: {masked(s['message'])}" for s in survivors).most_common(),
        "victim_raised": Counter(
            f"{v['type']}: {masked(v['message'])}" for v in victims if v
        ).most_common(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default="4,8")
    p.add_argument("--kills", type=int, default=50, help="kill iterations per world size")
    p.add_argument("--others", type=int, default=4, help="iterations of each other fault")
    p.add_argument("--max-delay", type=float, default=1.0, help="latest kill/stop, seconds")
    p.add_argument("--seed", type=int, default=20)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    rng = random.Random(args.seed)
    started = time.time()
    out = {
        "kind": "faults",
        "command": shlex.join([*COMMAND, *sys.argv[1:]]),
        "timeout_s": F.TIMEOUT_S,
        "tokens": F.TOKENS,
        "hidden": F.HIDDEN,
        "load_average_at_start": os.getloadavg(),
        "cores": os.cpu_count(),
        "faults": {},
    }
    for world in [int(w) for w in args.worlds.split(",")]:
        for fault in ("mismatch_tokens", "mismatch_op", "never_calls", "stop", "kill"):
            count = args.kills if fault == "kill" else args.others
            steps, leftovers, wrote = [], [], 0
            # A kill ends its world; the other faults share one world, init again between them.
            plans = (
                [F.random_plan(fault, world, rng, args.max_delay) for _ in range(count)]
                if fault == "kill"
                else [[F.random_plan(fault, world, rng, args.max_delay)[0] for _ in range(count)]]
            )
            for plan in plans:
                reports, left = run(world, plan)
                leftovers += left
                for (f, victim, delay), step in zip(plan, reports):
                    seen = F.detection(step)
                    steps.append({"victim": victim, "delay_s": delay, "ranks": seen})
                    if f == "stop":
                        wrote += any(
                            r["digest_before"] != r["digest_after"]
                            for r in step
                            if r and r["rank"] != victim
                        )
                print(f"world {world} {fault}: {len(steps)}/{count}", file=sys.stderr, flush=True)
            entry = summarise(steps)
            entry["left_in_dev_shm"] = leftovers
            if fault == "stop":
                entry["stopped_rank_wrote_after_sigcont"] = wrote
            entry["steps"] = [
                {
                    "victim": s["victim"],
                    "delay_s": round(s["delay_s"], 4),
                    "seconds": {r: v["seconds"] for r, v in s["ranks"].items()},
                }
                for s in steps
            ]
            out["faults"][f"world={world} {fault}"] = entry
    out["load_average_at_end"] = os.getloadavg()
    out["wall_s"] = time.time() - started
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    for key, entry in out["faults"].items():
        d = entry["survivor_detection_s"]
        print(f"{key}: median {d['median']:.3f} s, max {d['max']:.3f} s over {d['n']} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
