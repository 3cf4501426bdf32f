# SPDX-License-Identifier: Apache-2.0
"""How close the CPU shm boundary is to its floor: the sharded ``fused_layer`` over shm and over
gloo against the mHC math alone (``mhc_post_pre`` on this rank's rows, already reduced, with the
same threads), timed interleaved in one world of ``--tp`` ranks; a boundary is as slow as its
slowest rank. A sample is a burst of back-to-back calls started on all ranks together; bursts of
the three come in rounds so that a shared machine's drift biases none of them. Sets the glibc
allocator setting of bench/cpu_bench.sh before the ranks start.

    .venv/bin/python bench/shm_floor.py --tokens 16,2048 --json bench/results/cpu_shm_floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

GLIBC_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
os.environ.setdefault("GLIBC_TUNABLES", GLIBC_TUNABLES)  # before any rank starts

import torch  # noqa: E402

from mhc_sp import ops  # noqa: E402
from mhc_sp import reference as R  # noqa: E402
from mhc_sp.local_world import run_world  # noqa: E402
from mhc_sp.testing import pre_weights, random_inputs  # noqa: E402

PATHS = ("shm", "gloo", "math_alone")


def callables(rank, world, T, H, groups):
    i = random_inputs(T, 4, H, seed=0)
    g = torch.Generator().manual_seed(1 + rank)
    partial = torch.randn(T, H, generator=g).to(torch.bfloat16)
    shard = {k: R.shard_tokens(i[k], rank, world) for k in ("residual", "post", "comb")}
    rows = shard["residual"].shape[0]
    valid = max(0, min(rows, T - rank * rows))
    x = torch.randn(valid, H, generator=g).to(torch.bfloat16)
    own = {k: v[:valid] for k, v in shard.items()}
    proj = pre_weights(i)

    def fused(group):
        return lambda: ops.fused_layer(
            partial, shard["residual"], shard["post"], shard["comb"], *proj, group, True, T
        )

    return {
        "shm": fused(groups["shm"]),
        "gloo": fused(groups["gloo"]),
        "math_alone": lambda: ops.mhc_post_pre(x, own["residual"], own["post"], own["comb"], *proj),
    }


def worker(rank, world, tokens, H, rounds, per_round, burst_s):
    import torch.distributed as dist

    import mhc_sp.distributed as msd

    groups = {
        "shm": msd.init(None, "cpu", transport="shm"),
        "gloo": msd.init(dist.new_group(list(range(world))), "cpu", transport="gloo"),
    }
    out = []
    for T in tokens:
        fns = callables(rank, world, T, H, groups)
        once = []
        for fn in fns.values():
            for _ in range(3):
                fn()
            start = time.perf_counter()
            fn()
            once.append(time.perf_counter() - start)
        longest = torch.tensor(once, dtype=torch.float64)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)  # the same burst length on every rank
        burst = {n: max(1, min(50, int(burst_s / t))) for n, t in zip(fns, longest.tolist())}
        samples = {n: [] for n in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                for _ in range(per_round):
                    dist.barrier()
                    start = time.perf_counter()
                    for _ in range(burst[name]):
                        fn()
                    samples[name].append((time.perf_counter() - start) / burst[name])
        out.append({"tokens": T, **{n: statistics.median(s) for n, s in samples.items()}})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--tokens", default="16,2048")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--per-round", type=int, default=4)
    p.add_argument("--burst-s", type=float, default=0.02)
    p.add_argument("--json")
    args = p.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    load = os.getloadavg()
    per_rank = run_world(
        args.tp,
        worker,
        tokens,
        args.hidden,
        args.rounds,
        args.per_round,
        args.burst_s,
        threads=args.threads,
        timeout=3600,
    )
    rows = []
    for k, T in enumerate(tokens):
        slowest = {n: max(r[k][n] for r in per_rank) for n in PATHS}
        rows.append(
            {
                "tokens": T,
                **{f"{n}_us": slowest[n] * 1e6 for n in PATHS},
                "shm/math": slowest["shm"] / slowest["math_alone"],
                "gloo/math": slowest["gloo"] / slowest["math_alone"],
                "gloo/shm": slowest["gloo"] / slowest["shm"],
                "per_rank_shm/math": [r[k]["shm"] / r[k]["math_alone"] for r in per_rank],
            }
        )
    doc = {
        "kind": "shm_floor",
        "command": " ".join(["bench/shm_floor.py", *sys.argv[1:]]),
        "tp": args.tp,
        "hidden": args.hidden,
        "threads_per_rank": args.threads,
        "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES"),
        "load_average_before": load,
        "load_average_after": os.getloadavg(),
        "rows": rows,
    }
    for r in rows:
        print(
            f"T={r['tokens']:5d}  shm {r['shm_us']:9.1f} us  gloo {r['gloo_us']:9.1f} us  "
            f"math {r['math_alone_us']:9.1f} us  shm/math {r['shm/math']:.3f}  "
            f"gloo/shm {r['gloo/shm']:.2f}"
        )
    print(f"load average before {load}, after {doc['load_average_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
