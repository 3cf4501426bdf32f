# SPDX-License-Identifier: Apache-2.0
"""``mhc-sp-bench comm``: mhc_sp's collectives over a sweep of sizes, printed like nccl-tests.

size = bytes of the full buffer (all-reduce: the tensor; reduce-scatter: the input; all-gather:
the output), count = its elements, algbw = size / time, busbw = algbw x the standard bus factor
((n-1)/n for reduce-scatter and all-gather, 2(n-1)/n for all-reduce), comparable across world
sizes and with nccl-tests' numbers."""

from __future__ import annotations

import argparse

import torch

from ..launch import run_world
from ..profiling import phase, profiled
from . import report
from .flags import add_common_args, int_list
from .timing import rank_device, time_across_ranks

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
            return int(float(v[:-1] if scale > 1 else v) * scale)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad size {v!r}: expected e.g. 4096, 64K, 1M"
            ) from None

    if ":" in text:
        lo, hi = (parse(v) for v in text.split(":", 1))
        if lo <= 0 or hi < lo:
            raise argparse.ArgumentTypeError(f"bad size range {text!r}")
        sizes = []
        while lo <= hi:
            sizes.append(lo)
            lo *= 2
        return sizes
    return [parse(v) for v in text.split(",") if v.strip()]


def _worker(
    rank,
    world,
    sizes,
    dtype_name,
    warmup,
    repeats,
    device_type,
    transport,
    profile=None,
    trace=None,
):
    import mhc_sp.distributed as msd
    from mhc_sp import ops

    device = rank_device(device_type)
    group = msd.init(device=device_type, transport=transport)
    used = msd.transport(group, device_type)
    dtype = DTYPES[dtype_name]
    item = torch.empty((), dtype=dtype).element_size()
    out = []
    with profiled(profile if rank == 0 else None, trace):  # rank 0 alone feeds a profiler
        for size in sizes:
            rows = max(
                world, size // item // world * world
            )  # full buffer rows, a multiple of world
            full = torch.ones(rows, dtype=dtype, device=device)
            calls = {
                "reduce_scatter": lambda: ops.reduce_scatter(full, group),
                "all_gather": lambda: ops.all_gather(full[: rows // world], group),
                "all_reduce": lambda: ops.all_reduce(full, group),
            }
            for op, fn in calls.items():
                with phase(f"{op} {rows * item}B"):
                    out.append(
                        {
                            "op": op,
                            "size": rows * item,
                            "count": rows,
                            "transport": used,
                            "median": time_across_ranks(fn, device, warmup, repeats),
                        }
                    )
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "comm",
        help="reduce_scatter / all_gather / all_reduce sweeps (nccl-tests style)",
        description=__doc__,
    )
    p.add_argument("--tp", type=int_list, default=[2], help="world sizes (comma list)")
    p.add_argument(
        "--sizes",
        type=size_list,
        default=size_list("4K:16M"),
        help="bytes: 'MIN:MAX' doubling, or a comma list (K/M/G suffixes)",
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument(
        "--transport",
        default="auto",
        help="cpu: auto (shm on one host), shm, gloo; cuda: auto, symm, nccl",
    )
    add_common_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    device = torch.device(args.device)
    if min(args.tp) < 1:
        report.usage_error("comm", f"--tp: world sizes must be >= 1, got {args.tp}")
    from ..distributed import TRANSPORTS

    if args.transport not in TRANSPORTS.get(device.type, ()):
        allowed = ", ".join(TRANSPORTS.get(device.type, ()))
        report.usage_error(
            "comm",
            f"--transport: expected one of {allowed} for device "
            f"{device.type}, got {args.transport!r}",
        )
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    rows = []
    for world in args.tp:
        per_rank = run_world(
            world,
            _worker,
            args.sizes,
            args.dtype,
            args.warmup,
            args.repeats,
            device.type,
            args.transport,
            args.profile,
            args.trace,
            backend=backend,
            threads=1,
            timeout=600,
        )
        for rec in per_rank[0]:
            t = max(
                r["median"]
                for rank in per_rank
                for r in rank
                if r["op"] == rec["op"] and r["size"] == rec["size"]
            )
            algbw = rec["size"] / t / 1e9
            rows.append(
                {
                    "tp": world,
                    "transport": rec["transport"],
                    "op": rec["op"],
                    "size": rec["size"],
                    "count": rec["count"],
                    "type": args.dtype,
                    "time_us": t * 1e6,
                    "algbw_GB/s": algbw,
                    "busbw_GB/s": algbw * bus_factor(rec["op"], world),
                }
            )
    columns = [
        "tp",
        "transport",
        "op",
        "size",
        "count",
        "type",
        "time_us",
        "algbw_GB/s",
        "busbw_GB/s",
    ]

    def plot(ax, rows):
        for world in args.tp:
            for op in COLLECTIVES:
                pts = [
                    (r["size"], r["busbw_GB/s"]) for r in rows if r["op"] == op and r["tp"] == world
                ]
                ax.plot(*zip(*pts), marker="o", label=f"{op} tp={world}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes")
        ax.set_ylabel("busbw GB/s")
        ax.legend()

    report.emit("comm", rows, columns, args, device, plot=plot)
    return 0
