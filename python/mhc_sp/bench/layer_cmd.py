"""``mhc-sp-bench layer``: one SP sublayer boundary across world sizes and token counts:
``fused_layer`` sharded vs ``fused_layer`` replicated (all-reduce) vs the same sharded work as
separate ops (reduce_scatter, mhc_post, mhc_pre, all_gather). gloo ranks on CPU, NCCL on GPUs."""

from __future__ import annotations

import torch

from .. import reference as R
from ..launch import run_world
from ..testing import random_inputs
from . import report
from ..profiling import phase, profiled
from .flags import add_common_args, int_list
from .timing import rank_device, time_across_ranks

PATHS = ("fused_sharded", "fused_replicated", "separate_sharded")


def boundary_paths(i: dict, partial, rank: int, world: int, group: str, T: int) -> dict:
    """The three ways to run one boundary, as zero-argument callables on this rank."""
    from .. import ops

    shard = {k: R.shard_tokens(i[k], rank, world) for k in ("residual", "post", "comb")}
    w, proj = i["norm_weight"], (i["fn"], i["scale"], i["base"])

    def separate():
        x = ops.reduce_scatter(partial[:T], group)
        residual = ops.mhc_post(x, shard["residual"], shard["post"], shard["comb"])
        post, comb, layer_input = ops.mhc_pre(residual, *proj, w)
        return residual, post, comb, ops.all_gather(layer_input, group, T)

    return {
        "fused_sharded": lambda: ops.fused_layer(partial, shard["residual"], shard["post"], shard["comb"],
                                                 *proj, w, group, True, T),
        "fused_replicated": lambda: ops.fused_layer(partial, i["residual"], i["post"], i["comb"],
                                                    *proj, w, group, False, T),
        "separate_sharded": separate,
    }


def boundary_case(T: int, H: int, n: int, rank: int, world: int, group: str, device) -> dict:
    """Seeded inputs of one boundary of T tokens on this rank, as :func:`boundary_paths`."""
    i = random_inputs(T, n, H, seed=0, device=device)
    gen = torch.Generator().manual_seed(1 + rank)
    partial = torch.randn(T, H, generator=gen).to(device=device, dtype=torch.bfloat16)
    return boundary_paths(i, partial, rank, world, group, T)


def _worker(rank: int, world: int, tokens: list[int], H: int, n: int, warmup: int, repeats: int,
            device_type: str, profile=None, trace=None):
    import mhc_sp.distributed as msd

    device = rank_device(device_type)
    group = msd.init(device=device_type)
    out = []
    with profiled(profile if rank == 0 else None, trace):  # rank 0 alone feeds a profiler
        for T in tokens:
            for name, fn in boundary_case(T, H, n, rank, world, group, device).items():
                with phase(f"{name} T={T}"):
                    out.append({"tokens": T, "path": name,
                                "median": time_across_ranks(fn, device, warmup, repeats)})
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser("layer", help="one SP boundary: fused sharded vs replicated vs separate ops",
                              description=__doc__)
    add_layer_args(p)
    p.set_defaults(func=run)


def add_layer_args(p, tokens=(16, 256, 4096), tp=(2,), hidden=4096) -> None:
    p.add_argument("--tp", type=int_list, default=list(tp), help="world sizes (comma list)")
    p.add_argument("--tokens", type=int_list, default=list(tokens))
    p.add_argument("--hidden", type=int, default=hidden)
    p.add_argument("--hc-mult", type=int, default=4)
    add_common_args(p)


def run(args) -> int:
    device = torch.device(args.device)
    if min(args.tp) < 1:
        report.usage_error("layer", f"--tp: world sizes must be >= 1, got {args.tp}")
    if device.type == "cuda" and max(args.tp) > torch.cuda.device_count():
        report.usage_error("layer", f"--tp {max(args.tp)} needs that many GPUs, found {torch.cuda.device_count()}")
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    threads = args.threads or max(1, torch.get_num_threads() // max(args.tp))
    rows = []
    for world in args.tp:
        per_rank = run_world(world, _worker, args.tokens, args.hidden, args.hc_mult, args.warmup,
                             args.repeats, device.type, args.profile, args.trace, backend=backend,
                             threads=threads, timeout=600)
        for T in args.tokens:
            # A boundary is as slow as its slowest rank.
            t = {p: max(r["median"] for rank in per_rank for r in rank if r["tokens"] == T and r["path"] == p)
                 for p in PATHS}
            rows.append({"tp": world, "tokens": T, "hidden": args.hidden,
                         **{f"{p}_us": t[p] * 1e6 for p in PATHS},
                         "separate/fused": t["separate_sharded"] / t["fused_sharded"],
                         "replicated/fused": t["fused_replicated"] / t["fused_sharded"]})
    columns = ["tp", "tokens", "hidden", *(f"{p}_us" for p in PATHS), "separate/fused", "replicated/fused"]

    def plot(ax, rows):
        for p in PATHS:
            for world in args.tp:
                pts = [(r["tokens"], r[f"{p}_us"]) for r in rows if r["tp"] == world]
                ax.plot(*zip(*pts), marker="o", label=f"{p} tp={world}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("µs per boundary (slowest rank)")
        ax.legend()

    report.emit("layer", rows, columns, args, device, extra={"threads_per_rank": threads}, plot=plot)
    return 0
