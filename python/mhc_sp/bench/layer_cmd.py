# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench layer: one SP sublayer boundary across tensor-parallel sizes, token counts and
transports, three ways: fused_layer sharded (reduce-scatter, mHC post + pre on this rank's
tokens, all-gather, one op), fused_layer replicated (all-reduce, post + pre on every token), and
the sharded work as separate ops (reduce_scatter, mhc_post_pre, all_gather); beside them the
floor, math_alone: mhc_post_pre on this rank's tokens alone, with the same threads, no exchange.

Spawned ranks on CPU (transports shm and gloo), one GPU per rank on CUDA (symm, NCCL). Several
--transport values are timed in one world, each on its own group over the same ranks, and every
round samples every way, transport and count once, so their ratios come from the same run. Times
are the slowest rank's, as median [p10-p90]; speedup is replicated / fused sharded (median of the
paired ratios, 95% CI), x_separate is separate / fused sharded, x_<transport> compares a
transport's fused sharded time with the last one's, over_math_x is fused sharded / math_alone (how
close the boundary comes to its floor). Sharded beats replicated from the smallest
count where the speedup's interval lies above 1.05 at that count and every larger one (the rule
of mhc-sp-bench tune, without its finer measurement near the crossover)."""

from __future__ import annotations

import sys

import torch

from . import checks, decide, flags, machine, report
from .boundary import PATHS, boundary_case, check_ranks
from .timing import Sampling, median_interval, paired_ratios, run_ranks, slowest_rank, spread


def _worker(
    rank: int, world: int, how: Sampling, tokens: list[int], H: int, n: int, transports: list[str]
) -> dict:
    """This rank's samples of every (transport, path) at every count."""
    import torch.distributed as dist

    import mhc_sp.distributed as msd

    groups = {}
    for k, requested in enumerate(transports):  # WORLD for the first, a group of all ranks after
        pg = None if k == 0 else dist.new_group(list(range(world)))
        name = msd.init(pg, device=how.device_type, transport=requested)
        groups[msd.transport(name, how.device_type)] = name
    device = how.rank_device(rank, world)  # after the transports: see Sampling.rank_device
    cases = {
        T: {
            f"{t}:{path}": fn
            for t, group in groups.items()
            for path, fn in boundary_case(T, H, n, rank, world, group, device).items()
        }
        for T in tokens
    }
    with how.profiled(rank):
        samples = how.sample(rank, cases, f"layer -tp {world}", lambda T, way: f"layer T={T}")
    return {"transports": list(groups), "samples": samples}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "layer",
        help="one SP boundary: fused sharded vs replicated vs separate ops",
        description=__doc__,
    )
    flags.add_tensor_parallel_size(p, [2], sweep=True)
    flags.add_tokens(p, [16, 256, 4096])
    flags.add_hidden_size(p, 4096, sweep=False)
    flags.add_hc_mult(p)
    flags.add_transport(p, sweep=True)
    flags.add_measuring(p)
    p.set_defaults(func=run, validate=check, measures="ranks")


def check(args) -> None:
    check_ranks(args.prog, args.device, max(args.tensor_parallel_size), args.transport)
    tps = args.tensor_parallel_size
    args.threads = machine.threads_per_rank(max(tps), args.threads) if args.device == "cpu" else 1
    if args.device == "cpu":  # every count's inputs stay on every rank, once per transport
        per_rank = sum(checks.case_bytes(T, args.hidden_size, args.hc_mult) for T in args.tokens)
        need = max(tps) * len(args.transport) * per_rank
        checks.check_memory(args.prog, need, "--tokens, --hidden-size, --transport")


def rows_from_samples(per_rank: list[dict], world: int, tokens: list[int], H: int) -> list[dict]:
    """One row per (count, transport): each path's median and p10-p90 (us) over samples of the
    slowest rank; the speedup of sharded over replicated with its interval; the ratios."""
    transports = per_rank[0]["transports"]
    rows = []
    for T in tokens:
        way = {
            key: slowest_rank([r["samples"][T][key] for r in per_rank])
            for key in per_rank[0]["samples"][T]
        }
        for t in transports:
            row = {"tensor_parallel_size": world, "tokens": T, "hidden_size": H, "transport": t}
            for path in PATHS:
                median, p10, p90 = spread(way[f"{t}:{path}"])
                row |= {f"{path}_us": 1e6 * median, f"{path}_p10_us": 1e6 * p10}
                row[f"{path}_p90_us"] = 1e6 * p90
            sharded = way[f"{t}:fused_sharded"]
            ratio, lo, hi = median_interval(
                paired_ratios(way[f"{t}:fused_replicated"], sharded), decide.CONFIDENCE
            )
            row |= {"speedup_x": ratio, "speedup_lo_x": lo, "speedup_hi_x": hi}
            row["x_separate"] = median_interval(
                paired_ratios(way[f"{t}:separate_sharded"], sharded)
            )[0]
            row["over_math_x"] = median_interval(paired_ratios(sharded, way[f"{t}:math_alone"]))[0]
            row["faster"] = decide.classify(row)
            if len(transports) > 1:
                base = way[f"{transports[-1]}:fused_sharded"]
                row[f"x_{transports[-1]}"] = median_interval(paired_ratios(base, sharded))[0]
            rows.append(row)
    return rows


def crossover(rows: list[dict]) -> dict:
    """Per tensor-parallel size and transport: the smallest count from which sharded beats
    replicated at that count and every larger one (:func:`decide.faster_from`; None: not in the
    measured range)."""
    keys = dict.fromkeys((r["tensor_parallel_size"], r["transport"]) for r in rows)
    return {
        f"tp={tp} {t}": decide.faster_from(
            [r for r in rows if (r["tensor_parallel_size"], r["transport"]) == (tp, t)]
        )
        for tp, t in keys
    }


def run(args) -> int:
    device = torch.device(args.device)
    machine.warn_oversubscribed(args.prog, max(args.tensor_parallel_size), args.threads)
    rows = []
    for world in args.tensor_parallel_size:
        print(
            f"layer: -tp {world}: {len(args.tokens)} token counts x {len(args.transport)} "
            f"transport(s) x 3 ways and the math alone, {args.repeats} rounds (starting the "
            f"ranks takes a few seconds) ...",
            file=sys.stderr,
            flush=True,
        )
        per_rank = run_ranks(
            args.prog,
            world,
            _worker,
            Sampling.of(args),
            args.tokens,
            args.hidden_size,
            args.hc_mult,
            args.transport,
        )
        if per_rank is None:
            return 1
        rows += rows_from_samples(per_rank, world, args.tokens, args.hidden_size)
    doc = report.document(
        "layer",
        rows,
        device,
        extra={
            "threads_per_rank": args.threads,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "sharded_beats_replicated_from_tokens": crossover(rows),
        },
        argv=args.argv,
    )
    report.publish(doc, args, present)
    return 0


def present(doc: dict) -> tuple:
    rows = doc["rows"]
    columns = [
        report.col("tensor_parallel_size", "tp"),
        report.col("tokens"),
        report.col("hidden_size"),
        report.col("transport"),
        *(report.spread_col(f"{p}_us") for p in PATHS),
        report.interval_col("speedup_x [95% CI]", "speedup_x", "speedup_lo_x", "speedup_hi_x"),
        report.col("x_separate"),
        report.col("over_math_x"),
        *(
            report.col(k)
            for k in dict.fromkeys(k for r in rows for k in r)
            if k.startswith("x_") and k != "x_separate"
        ),
        report.col("faster"),
    ]
    cross = doc["sharded_beats_replicated_from_tokens"]
    line = "sharded beats replicated from: " + ", ".join(
        f"{k}: {'no count measured' if v is None else decide.tokens_text([v])}"
        for k, v in cross.items()
    )
    return [], columns, [line], plot


def plot(ax, doc: dict) -> None:
    rows = doc["rows"]
    cross = doc["sharded_beats_replicated_from_tokens"]
    keys = list(dict.fromkeys((r["tensor_parallel_size"], r["transport"]) for r in rows))
    styles = ["-", "--", ":", "-."]
    for k, (tp, t) in enumerate(keys):
        mine = [r for r in rows if (r["tensor_parallel_size"], r["transport"]) == (tp, t)]
        for color, path in enumerate(PATHS):  # one colour per path, one line style per key
            ax.plot(
                [r["tokens"] for r in mine],
                [r[f"{path}_us"] for r in mine],
                marker="o",
                markersize=3,
                color=f"C{color}",
                linestyle=styles[k % len(styles)],
                label=f"{path} tp={tp} {t}",
            )
        at = cross[f"tp={tp} {t}"]
        report.mark_crossover(ax, at, f"SP from {at} (tp={tp} {t})")
    report.log2_tokens_axis(ax, "tokens")
    ax.set_yscale("log")
    ax.set_ylabel("us per boundary (slowest rank), median")
    ax.legend(fontsize=6)
