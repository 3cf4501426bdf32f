# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench tune: measure, on this machine, from how many tokens sequence parallelism (SP)
pays off, and recommend --sp-threshold.

It times one sublayer boundary (fused_layer: hidden size H, n streams) at each token count of a
sweep, on -tp ranks (shared memory or gloo on CPU, symm or NCCL on GPUs), both ways:

  with SP (sharded):        reduce-scatter the partial, mHC post + pre on this rank's T/tp
                            tokens, all-gather the next layer's input;
  without SP (replicated):  all-reduce the partial, mHC post + pre on all T tokens on every rank.

Every round takes one sample of both ways at every count, the two ways back to back in
alternating order, so that a shared machine's drift hits all of them alike; a sample is a burst
of back-to-back calls (milliseconds, however short one call is), as slow as its slowest rank.
Times are medians with their p10-p90 spread; the speedup is the median of the paired ratios
(without / with SP) with its 95% confidence interval. Differences under 5% are within the
measurement's resolution: SP counts as faster at a count only when that whole interval lies above
1.05, slower when below 0.95, equivalent when within 0.95-1.05, and not settled otherwise (such
counts get more rounds).

The recommended threshold is the smallest measured count from which SP is never slower by more
than the margin (above the largest count where it is), above --max-cudagraph-capture-size (SP
never engages on a captured size); there is none when SP is faster at no count from there on.
From the threshold up to the first count where SP is faster, SP and no SP are not told apart:
that is the band, and every threshold in it costs the same within the margin; the verdict names
it and what SP costs there at worst. Noise within the margin moves a count between faster,
equivalent and not settled, which moves the band's upper end but never the threshold. Before
deciding, the counts between the largest count where SP is slower and the threshold (powers of
two) are measured too, with four times the rounds. Where no count qualifies, the verdict says
so.

mhc-sp-bench project --calibrate FILE fits the analytical cost model to the --json file of a
tune run, to estimate other sizes."""

from __future__ import annotations

import re
import sys
import textwrap

import torch

from ..engine.config import EngineArgs
from . import checks, decide, flags, machine, report
from .boundary import boundary_case, check_ranks
from .timing import Sampling, median_interval, paired_ratios, run_ranks, slowest_rank, spread

#: The sweep of ``tune`` (decode sizes to long prefill chunks).
TOKENS = [1, 4, 16, 64, 256, 1024, 4096]
#: Counts still unsettled after --repeats rounds get more, up to this many times --repeats.
EXTEND = 4


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="measure from how many tokens SP pays off here; recommend --sp-threshold",
        description=__doc__,
    )
    EngineArgs.add_cli_args(
        p,
        only=("tensor_parallel_size", "hidden_size", "max_cudagraph_capture_size"),
        defaults={"tensor_parallel_size": 2, "hidden_size": 4096},
    )
    flags.add_tokens(p, TOKENS)
    flags.add_hc_mult(p)
    flags.add_transport(p, sweep=False)
    flags.add_measuring(p)
    p.set_defaults(func=run, validate=check, measures="ranks")


def check(args) -> None:
    tp = args.tensor_parallel_size
    if tp < 2:
        checks.usage_error(
            args.prog, f"--tensor-parallel-size: SP needs at least 2 ranks, got {tp}"
        )
    check_ranks(args.prog, args.device, tp, args.transport)
    capture = args.max_cudagraph_capture_size
    args.tokens = sorted(set(args.tokens) | ({capture + 1} if capture else set()))
    args.threads = machine.threads_per_rank(tp, args.threads) if args.device == "cpu" else 1
    if args.device == "cpu":  # every count's inputs stay on every rank for the whole run
        need = tp * sum(checks.case_bytes(T, args.hidden_size, args.hc_mult) for T in args.tokens)
        checks.check_memory(args.prog, need, "--tokens, --hidden-size")


# ---- measuring ------------------------------------------------------------------------------


def _measure(
    rank: int,
    world: int,
    how: Sampling,
    tokens: list[int],
    H: int,
    n: int,
    transport: str,
    max_capture: int,
) -> dict:
    """This rank's samples of both ways at every count (:func:`sample_across_ranks`): the sweep,
    then the counts :func:`decide.refine_between` names between the largest count where SP is
    slower and the threshold."""
    import torch.distributed as dist

    import mhc_sp.distributed as msd

    group = msd.init(device=how.device_type, transport=transport)
    device = how.rank_device(rank, world)  # after the transport: see Sampling.rank_device

    def measure(counts: list[int], name: str, repeats: int) -> dict:
        cases = {}
        for T in counts:
            paths = boundary_case(T, H, n, rank, world, group, device)
            cases[T] = {"sharded": paths["fused_sharded"], "replicated": paths["fused_replicated"]}
        return how.sample(
            rank,
            cases,
            name,
            lambda T, way: f"tune T={T}",
            repeats=repeats,
            unsettled=unsettled,
            max_repeats=EXTEND * how.repeats,
        )

    with how.profiled(rank):
        samples = measure(tokens, "tune", how.repeats)
        everyone = [None] * world
        dist.all_gather_object(everyone, samples)  # every rank decides alike on the same samples
        rows = rows_from_samples([{"samples": s} for s in everyone], tokens)
        finer = decide.refine_between(rows, max_capture)
        if finer:  # the most rounds at once: these counts sit where the decision is made
            near = f"tune: {decide.tokens_text(finer)} (near the crossover)"
            samples |= measure(finer, near, EXTEND * how.repeats)
    return {"transport": msd.transport(group, how.device_type), "samples": samples}


def speedup(ways: dict) -> tuple[float, float, float]:
    """(median, lo, hi) of the paired ratios without SP / with SP of one count's samples."""
    return median_interval(paired_ratios(ways["replicated"], ways["sharded"]), decide.CONFIDENCE)


def slowest(per_rank_case: list[dict]) -> dict:
    """One count's samples of each way, sample by sample the slowest rank's."""
    return {
        name: slowest_rank([r[name] for r in per_rank_case]) for name in ("sharded", "replicated")
    }


def unsettled(per_rank_case: list[dict]) -> bool:
    """Whether one count is not settled by :func:`decide.classify` (it gets more rounds)."""
    _, lo, hi = speedup(slowest(per_rank_case))
    return decide.classify({"speedup_lo_x": lo, "speedup_hi_x": hi}) == decide.UNSETTLED


def rows_from_samples(per_rank: list[dict], tokens: list[int]) -> list[dict]:
    """One row per count: each way's median and p10-p90 (ms) over samples of the slowest rank,
    the speedup with its interval from the paired samples, and how many rounds there were."""
    rows = []
    for T in tokens:
        ways = slowest([r["samples"][T] for r in per_rank])
        row = {"tokens": T}
        for name, samples in ways.items():
            median, p10, p90 = spread(samples)
            row |= {f"{name}_ms": 1e3 * median, f"{name}_p10_ms": 1e3 * p10}
            row[f"{name}_p90_ms"] = 1e3 * p90
        ratio, lo, hi = speedup(ways)
        row |= {"speedup_x": ratio, "speedup_lo_x": lo, "speedup_hi_x": hi}
        row |= {"faster": decide.classify(row), "rounds": len(ways["sharded"])}
        rows.append(row)
    return rows


def run(args) -> int:
    tp, H, device = args.tensor_parallel_size, args.hidden_size, torch.device(args.device)
    machine.warn_oversubscribed(args.prog, tp, args.threads)
    print(
        f"tune: timing one layer boundary with and without SP at {len(args.tokens)} token "
        f"counts on {tp} {device.type} ranks, {args.repeats} rounds (starting the ranks takes "
        f"a few seconds) ...",
        file=sys.stderr,
        flush=True,
    )
    per_rank = run_ranks(
        args.prog,
        tp,
        _measure,
        Sampling.of(args),
        args.tokens,
        H,
        args.hc_mult,
        args.transport,
        args.max_cudagraph_capture_size,
    )
    if per_rank is None:
        return 1
    rows = rows_from_samples(per_rank, sorted(per_rank[0]["samples"]))
    capture = args.max_cudagraph_capture_size
    same_cost = decide.same_cost(rows, capture)
    doc = report.document(
        "tune",
        rows,
        device,
        extra={
            "tensor_parallel_size": tp,
            "hidden_size": H,
            "hc_mult": args.hc_mult,
            "transport": per_rank[0]["transport"],
            "threads_per_rank": args.threads,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "interval": f"{decide.CONFIDENCE:.0%} confidence interval of the median paired ratio",
            "max_cudagraph_capture_size": capture,
            "recommended_sp_threshold": decide.recommend(rows, capture),
            "margin": decide.MARGIN,
            "band_tokens": [r["tokens"] for r in decide.band(rows, capture)],
            "same_cost_sp_thresholds": None if same_cost is None else list(same_cost),
            "verdict": decide.verdict(rows, tp, capture),
        },
        argv=args.argv,
    )
    report.publish(doc, args, present)
    return 0


# ---- presenting -----------------------------------------------------------------------------


def present(doc: dict) -> tuple:
    """The table, the lines around it and the plot of a tune document."""
    device = doc["environment"]["device"].split(":")[0]
    intro = [
        f"One layer boundary, hidden size {doc['hidden_size']}, {doc['hc_mult']} streams, on "
        f"{doc['tensor_parallel_size']} {device} ranks (transport {doc['transport']}, "
        f"{doc['threads_per_rank']} thread(s) each).",
        f"{doc['repeats']} interleaved rounds, up to {EXTEND * doc['repeats']} for counts not "
        f"settled by then.",
        f"Times: the slowest rank's, median [p10-p90]; speedup: without / with SP, median "
        f"[{decide.CONFIDENCE:.0%} CI].",
        decide.RULE.format(margin=f"{decide.MARGIN:.0%}"),
    ]
    columns = [
        report.col("tokens"),
        report.spread_col("sharded_ms", "with SP, ms"),
        report.spread_col("replicated_ms", "without SP, ms"),
        report.interval_col("speedup, x", "speedup_x", "speedup_lo_x", "speedup_hi_x"),
        ("faster", decide.classify),  # by today's rule, also for a file recorded before it
        report.col("rounds"),
    ]
    # The verdict by today's rule, as the "faster" column, also for a file recorded before it.
    said = decide.verdict(
        doc["rows"], doc["tensor_parallel_size"], doc["max_cudagraph_capture_size"]
    )
    verdict = [part for line in said for part in wrap(line)]
    return intro, columns, verdict, plot


def wrap(line: str, width: int = 100) -> list[str]:
    """``line`` in lines of at most ``width``, a quoted speedup (``1.23x [1.1-1.4] at 16``) never
    split."""
    keep = re.sub(r"\d+\.\d\dx \[[^\]]*\] at \d+", lambda m: m[0].replace(" ", "\0"), line)
    return [part.replace("\0", " ") for part in textwrap.wrap(keep, width)]


def plot(ax, doc: dict) -> None:
    rows = doc["rows"]
    tokens = [r["tokens"] for r in rows]
    for name, label in (("sharded", "with SP (sharded)"), ("replicated", "without SP")):
        mid = [r[f"{name}_ms"] for r in rows]
        err = [
            [m - r[f"{name}_p10_ms"] for m, r in zip(mid, rows)],
            [r[f"{name}_p90_ms"] - m for m, r in zip(mid, rows)],
        ]
        ax.errorbar(tokens, mid, yerr=err, marker="o", capsize=3, label=label)
    threshold = decide.recommend(rows, doc["max_cudagraph_capture_size"])  # as the verdict
    report.mark_crossover(ax, threshold, f"--sp-threshold {threshold}")
    report.log2_tokens_axis(ax, "tokens")
    ax.set_yscale("log")
    ax.set_ylabel("ms per boundary (slowest rank), median and p10-p90")
    ax.legend(fontsize=8)
