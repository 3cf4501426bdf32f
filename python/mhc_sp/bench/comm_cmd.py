# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench comm: mhc_sp's collectives over a sweep of sizes, printed like nccl-tests.

size_B = bytes of the full buffer (all-reduce: the tensor; reduce-scatter: the input;
all-gather: the output), rounded to whole rows of every rank; count = its elements; algbw =
size / time; busbw = algbw x the standard bus factor ((n-1)/n for reduce-scatter and
all-gather, 2(n-1)/n for all-reduce), comparable across world sizes and with nccl-tests'
numbers. Every round samples each collective at each size once; times are the slowest rank's,
as median [p10-p90]."""

from __future__ import annotations

import argparse
import sys

import torch

from . import checks, flags, machine, report
from .timing import Sampling, run_ranks, slowest_rank, spread

COLLECTIVES = ("reduce_scatter", "all_gather", "all_reduce")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def bus_factor(op: str, world: int) -> float:
    """nccl-tests' busbw / algbw ratio."""
    if world == 1:
        return 1.0
    return 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world


def size_list(text: str) -> list[int]:
    """'1K:64M' (doubling, like nccl-tests -b/-e -f 2) or '4096,1M'."""

    def parse(v: str) -> int:
        v = v.strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:], 1)
        try:
            value = float(v[:-1] if scale > 1 else v) * scale
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError(v)
            return int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad size {v!r}: expected e.g. 4096, 64K, 1M"
            ) from None

    if ":" in text:
        lo, hi = (parse(v) for v in text.split(":", 1))
        if lo <= 0 or hi < lo:
            raise argparse.ArgumentTypeError(f"bad size range {text!r}: expected 0 < MIN <= MAX")
        sizes = []
        while lo <= hi:
            sizes.append(lo)
            lo *= 2
        return sizes
    sizes = [parse(v) for v in text.split(",") if v.strip()]
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"bad sizes {text!r}: expected sizes > 0 bytes")
    return list(dict.fromkeys(sizes))


def buffer_rows(size: int, dtype_name: str, world: int) -> int:
    """Elements of the full buffer nearest below ``size`` bytes that split into equal rows on
    every rank (at least one per rank)."""
    item = torch.empty((), dtype=DTYPES[dtype_name]).element_size()
    return max(world, size // item // world * world)


def _worker(rank: int, world: int, how: Sampling, sizes: list[int], dtype_name: str, transport):
    import mhc_sp.distributed as msd
    from mhc_sp import ops

    group = msd.init(device=how.device_type, transport=transport)
    device = how.rank_device(rank, world)  # after the transport: see Sampling.rank_device
    dtype = DTYPES[dtype_name]
    cases = {}
    for size in sizes:
        rows = buffer_rows(size, dtype_name, world)
        full = torch.ones(rows, dtype=dtype, device=device)
        shard = full[: rows // world]
        cases[size] = {
            "reduce_scatter": lambda full=full: ops.reduce_scatter(full, group),
            "all_gather": lambda shard=shard: ops.all_gather(shard, group),
            "all_reduce": lambda full=full: ops.all_reduce(full, group),
        }
    with how.profiled(rank):
        samples = how.sample(rank, cases, f"comm -tp {world}", lambda size, op: f"{op} {size}B")
    return {"transport": msd.transport(group, how.device_type), "samples": samples}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "comm",
        help="reduce_scatter / all_gather / all_reduce sweeps (nccl-tests style)",
        description=__doc__,
    )
    flags.add_tensor_parallel_size(p, [2], sweep=True)
    p.add_argument(
        "--sizes",
        type=size_list,
        default=size_list("4K:16M"),
        metavar="SIZES",
        help="bytes of the full buffer: MIN:MAX doubling, or a comma list (K/M/G suffixes) "
        "(default: 4K:16M)",
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="element type")
    flags.add_transport(p, sweep=False)
    flags.add_measuring(p, threads=False)
    p.set_defaults(func=run, validate=check, measures="ranks")


def check(args) -> None:
    from .tune_cmd import check_ranks

    check_ranks(args.prog, args.device, max(args.tensor_parallel_size), args.transport)
    args.threads = 1  # collectives copy; the ranks share the cores
    if args.device == "cpu":  # every size's buffers and outputs stay on every rank
        need = max(args.tensor_parallel_size) * 3 * sum(args.sizes)
        checks.check_memory(args.prog, need, "--sizes")


def run(args) -> int:
    device = torch.device(args.device)
    machine.warn_oversubscribed(args.prog, max(args.tensor_parallel_size), 1)
    rows = []
    for world in args.tensor_parallel_size:
        item = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
        moved = [s for s in args.sizes if buffer_rows(s, args.dtype, world) * item != s]
        if moved:
            print(
                f"comm: -tp {world}: sizes {', '.join(map(str, moved))} B rounded to whole "
                f"{args.dtype} rows of every rank (size_B shows what was measured)",
                file=sys.stderr,
            )
        per_rank = run_ranks(
            args.prog,
            world,
            _worker,
            Sampling.of(args),
            args.sizes,
            args.dtype,
            args.transport,
        )
        if per_rank is None:
            return 1
        for size in args.sizes:
            count = buffer_rows(size, args.dtype, world)
            for op in COLLECTIVES:
                median, p10, p90 = spread(slowest_rank([r["samples"][size][op] for r in per_rank]))
                algbw = count * item / median / 1e9
                rows.append(
                    {
                        "tensor_parallel_size": world,
                        "transport": per_rank[0]["transport"],
                        "op": op,
                        "size_B": count * item,
                        "count": count,
                        "type": args.dtype,
                        "time_us": 1e6 * median,
                        "time_p10_us": 1e6 * p10,
                        "time_p90_us": 1e6 * p90,
                        "algbw_GB/s": algbw,
                        "busbw_GB/s": algbw * bus_factor(op, world),
                    }
                )
    doc = report.document(
        "comm",
        rows,
        device,
        extra={"warmup": args.warmup, "repeats": args.repeats},
        argv=args.argv,
    )
    report.publish(doc, args, present)
    return 0


def present(doc: dict) -> tuple:
    columns = [
        report.col("tensor_parallel_size", "tp"),
        "transport",
        "op",
        "size_B",
        "count",
        "type",
        report.spread_col("time_us"),
        "algbw_GB/s",
        "busbw_GB/s",
    ]
    return [], columns, [], plot


def plot(ax, doc: dict) -> None:
    rows = doc["rows"]
    for world in dict.fromkeys(r["tensor_parallel_size"] for r in rows):
        for op in COLLECTIVES:
            pts = [
                (r["size_B"], r["busbw_GB/s"])
                for r in rows
                if r["op"] == op and r["tensor_parallel_size"] == world
            ]
            ax.plot(*zip(*pts), marker="o", label=f"{op} tp={world}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes")
    ax.set_ylabel("busbw, GB/s (median time)")
    ax.legend(fontsize=8)
