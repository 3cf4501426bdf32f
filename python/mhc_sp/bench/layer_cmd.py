# SPDX-License-Identifier: Apache-2.0
"""``mhc-sp-bench layer``: one SP sublayer boundary across world sizes, token counts and
transports: ``fused_layer`` sharded vs ``fused_layer`` replicated (all-reduce) vs the same sharded
work as separate ops (reduce_scatter, mhc_post_pre, all_gather). Spawned ranks on CPU (transports
shm and gloo), one GPU per rank with NCCL. Several ``--transport`` values are timed in one world,
interleaved, each on its own group over the same ranks, so their ratios come from the same run."""

from __future__ import annotations

import statistics
import time

import torch

from .. import reference as R
from ..launch import run_world
from ..profiling import phase, profiled
from ..testing import random_inputs
from . import report
from .flags import add_common_args, int_list

PATHS = ("fused_sharded", "fused_replicated", "separate_sharded")


def boundary_paths(i: dict, partial, rank: int, world: int, group: str, T: int) -> dict:
    """The three ways to run one boundary, as zero-argument callables on this rank."""
    from .. import ops

    shard = {k: R.shard_tokens(i[k], rank, world) for k in ("residual", "post", "comb")}
    w, proj = i["norm_weight"], (i["fn"], i["scale"], i["base"])

    def separate():
        x = ops.reduce_scatter(partial[:T], group)
        residual, post, comb, layer_input = ops.mhc_post_pre(
            x, shard["residual"], shard["post"], shard["comb"], *proj, w
        )
        return residual, post, comb, ops.all_gather(layer_input, group, T)

    return {
        "fused_sharded": lambda: ops.fused_layer(
            partial, shard["residual"], shard["post"], shard["comb"], *proj, w, group, True, T
        ),
        "fused_replicated": lambda: ops.fused_layer(
            partial, i["residual"], i["post"], i["comb"], *proj, w, group, False, T
        ),
        "separate_sharded": separate,
    }


def boundary_case(T: int, H: int, n: int, rank: int, world: int, group: str, device) -> dict:
    """Seeded inputs of one boundary of T tokens on this rank, as :func:`boundary_paths`."""
    i = random_inputs(T, n, H, seed=0, device=device)
    gen = torch.Generator().manual_seed(1 + rank)
    partial = torch.randn(T, H, generator=gen).to(device=device, dtype=torch.bfloat16)
    return boundary_paths(i, partial, rank, world, group, T)


def time_interleaved(
    fns: dict, device: torch.device, warmup: int, repeats: int, burst_s: float = 0.02
) -> dict:
    """Median seconds per call of each callable on this rank. A sample is a burst of back-to-back
    calls (about ``burst_s`` long, the same count on every rank) that starts on all ranks together
    (a barrier first) and ends on the device: the ranks' skew leaving the barrier is spread over
    the burst, as it is over an engine's consecutive boundaries. Bursts come in rounds (a a a,
    b b b, ..., a a a, ...) so that a shared machine's drift biases none of the callables. Called
    by every rank of the world."""
    import torch.distributed as dist

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    longest = []
    for fn in fns.values():
        for _ in range(warmup):
            fn()
        sync()
        start = time.perf_counter()
        fn()
        sync()
        longest.append(time.perf_counter() - start)
    longest = torch.tensor(longest, dtype=torch.float64)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)  # one burst length on every rank
    bursts = {
        name: max(1, min(20, int(burst_s / max(t, 1e-9)))) for name, t in zip(fns, longest.tolist())
    }
    rounds = max(1, min(5, repeats))
    per_round = -(-repeats // rounds)
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(per_round):
                dist.barrier()
                sync()
                start = time.perf_counter()
                for _ in range(bursts[name]):
                    fn()
                sync()
                samples[name].append((time.perf_counter() - start) / bursts[name])
    return {name: statistics.median(s) for name, s in samples.items()}


def _worker(
    rank: int,
    world: int,
    tokens: list[int],
    H: int,
    n: int,
    warmup: int,
    repeats: int,
    device_type: str,
    transports: list[str],
    profile=None,
    trace=None,
):
    import torch.distributed as dist

    import mhc_sp.distributed as msd

    from .timing import rank_device

    device = rank_device(device_type)
    groups = {}
    for k, requested in enumerate(transports):  # WORLD for the first, a group of all ranks after
        pg = None if k == 0 else dist.new_group(list(range(world)))
        name = msd.init(pg, device=device_type, transport=requested)
        groups[msd.transport(name, device_type)] = name
    out = []
    with profiled(profile if rank == 0 else None, trace):  # rank 0 alone feeds a profiler
        for T in tokens:
            fns = {
                (t, name): fn
                for t, group in groups.items()
                for name, fn in boundary_case(T, H, n, rank, world, group, device).items()
            }
            with phase(f"layer T={T}"):
                medians = time_interleaved(fns, device, warmup, repeats)
            out += [
                {"tokens": T, "transport": t, "path": p, "median": m}
                for (t, p), m in medians.items()
            ]
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "layer",
        help="one SP boundary: fused sharded vs replicated vs separate ops",
        description=__doc__,
    )
    add_layer_args(p)
    p.set_defaults(func=run)


def transport_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_layer_args(p, tokens=(16, 256, 4096), tp=(2,), hidden=4096) -> None:
    p.add_argument("--tp", type=int_list, default=list(tp), help="world sizes (comma list)")
    p.add_argument("--tokens", type=int_list, default=list(tokens))
    p.add_argument("--hidden", type=int, default=hidden)
    p.add_argument("--hc-mult", type=int, default=4)
    p.add_argument(
        "--transport",
        type=transport_list,
        default=["auto"],
        help="comma list, timed in one run: cpu: auto (shm on one host), shm, gloo; "
        "cuda: auto, symm, nccl. Ratios x_<last> compare each with the last one",
    )
    add_common_args(p)


def crossover(rows: list[dict]) -> dict:
    """Per (tp, transport): the smallest measured token count from which the sharded boundary
    stays faster than the replicated one (None: never in the measured range)."""
    found = {}
    for key in sorted({(r["tp"], r["transport"]) for r in rows}):
        mine = sorted(
            (r for r in rows if (r["tp"], r["transport"]) == key), key=lambda r: r["tokens"]
        )
        at = None
        for r in reversed(mine):
            if r["fused_sharded_us"] >= r["fused_replicated_us"]:
                break
            at = r["tokens"]
        found[f"tp={key[0]} {key[1]}"] = at
    return found


def run(args) -> int:
    from ..distributed import TRANSPORTS

    device = torch.device(args.device)
    if min(args.tp) < 1:
        report.usage_error("layer", f"--tp: world sizes must be >= 1, got {args.tp}")
    if device.type == "cuda" and max(args.tp) > torch.cuda.device_count():
        report.usage_error(
            "layer", f"--tp {max(args.tp)} needs that many GPUs, found {torch.cuda.device_count()}"
        )
    allowed = TRANSPORTS.get(device.type, ())
    bad = [t for t in args.transport if t not in allowed]
    if bad or not args.transport or len(set(args.transport)) != len(args.transport):
        report.usage_error(
            "layer",
            f"--transport: expected distinct values from "
            f"{', '.join(allowed)} for device {device.type}, got "
            f"{','.join(args.transport)}",
        )
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    threads = args.threads or max(1, torch.get_num_threads() // max(args.tp))
    rows = []
    for world in args.tp:
        per_rank = run_world(
            world,
            _worker,
            args.tokens,
            args.hidden,
            args.hc_mult,
            args.warmup,
            args.repeats,
            device.type,
            args.transport,
            args.profile,
            args.trace,
            backend=backend,
            threads=threads,
            timeout=1800,
        )
        transports = list(dict.fromkeys(r["transport"] for r in per_rank[0]))
        for T in args.tokens:
            # A boundary is as slow as its slowest rank.
            t = {
                (tr, p): max(
                    r["median"]
                    for rank in per_rank
                    for r in rank
                    if (r["tokens"], r["transport"], r["path"]) == (T, tr, p)
                )
                for tr in transports
                for p in PATHS
            }
            for tr in transports:
                row = {
                    "tp": world,
                    "tokens": T,
                    "hidden": args.hidden,
                    "transport": tr,
                    **{f"{p}_us": t[tr, p] * 1e6 for p in PATHS},
                    "separate/fused": t[tr, "separate_sharded"] / t[tr, "fused_sharded"],
                    "replicated/fused": t[tr, "fused_replicated"] / t[tr, "fused_sharded"],
                }
                if len(transports) > 1:
                    base = t[transports[-1], "fused_sharded"]
                    row[f"x_{transports[-1]}"] = base / t[tr, "fused_sharded"]
                rows.append(row)
    columns = [
        "tp",
        "tokens",
        "hidden",
        "transport",
        *(f"{p}_us" for p in PATHS),
        "separate/fused",
        "replicated/fused",
        *sorted({k for r in rows for k in r if k.startswith("x_")}),
    ]

    def plot(ax, rows):
        for key in sorted({(r["tp"], r["transport"]) for r in rows}):
            for p in PATHS:
                pts = [
                    (r["tokens"], r[f"{p}_us"]) for r in rows if (r["tp"], r["transport"]) == key
                ]
                ax.plot(*zip(*pts), marker="o", label=f"{p} tp={key[0]} {key[1]}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("µs per boundary (slowest rank)")
        ax.legend(fontsize=6)

    cross = crossover(rows)
    report.emit(
        "layer",
        rows,
        columns,
        args,
        device,
        extra={"threads_per_rank": threads, "sharded_beats_replicated_from_tokens": cross},
        plot=plot,
    )
    print(
        "sharded beats replicated from: "
        + ", ".join(f"{k}: {v if v is not None else 'never'} tokens" for k, v in cross.items())
    )
    return 0
