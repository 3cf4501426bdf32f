# SPDX-License-Identifier: Apache-2.0
"""``mhc-sp-bench tune``: measure, on this machine, from how many tokens sequence parallelism pays
off, and recommend ``--sp-threshold``.

It times one sublayer boundary (``fused_layer``, hidden size H, n = 4 streams) over a sweep of
token counts, on ``-tp`` ranks (gloo or shared-memory ranks on CPU, NCCL on GPUs), both ways:

* with SP (sharded): reduce-scatter the partial, mHC post + pre on this rank's ``T/tp`` tokens,
  all-gather the next layer's input;
* without SP (replicated): all-reduce the partial, mHC post + pre on all ``T`` tokens on every
  rank.

The two calls are timed interleaved, every rank starting together, and a boundary counts as long
as its slowest rank. The recommended threshold is the smallest measured count from which the
sharded boundary is faster at every larger measured count, and it is always above
``--max-cudagraph-capture-size`` (SP never engages on a captured size). ``--calibrate`` also fits
``mhc-sp-bench project``'s cost model to the measurements, which estimates the crossover even
when it lies outside the sweep.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Optional

import torch

from ..config import EngineArgs
from ..launch import run_world
from . import report
from .flags import int_list
from .layer_cmd import boundary_case
from .timing import rank_device, time_across_ranks

#: The sweep of ``tune`` (decode sizes to long prefill chunks).
TOKENS = [1, 4, 16, 64, 256, 1024, 4096]
#: The sweep and repeats of the quick tune that ``mhc-sp-bench`` runs without a subcommand.
QUICK = ["--tokens", "4,16,64,256,1024", "--warmup", "1", "--repeats", "8"]
#: glibc settings for the spawned CPU ranks: keep freed memory instead of mapping every large
#: output afresh (README, "Large outputs and glibc"), which would charge page faults to whichever
#: path allocates more.
GLIBC_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="measure from how many tokens SP pays off here; recommend --sp-threshold",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    EngineArgs.add_cli_args(
        p,
        only=("tensor_parallel_size", "hidden_size", "max_cudagraph_capture_size"),
        defaults={"tensor_parallel_size": 2, "hidden_size": 4096},
    )
    p.add_argument(
        "--tokens",
        type=int_list,
        default=TOKENS,
        help=f"token counts to measure (default: {','.join(map(str, TOKENS))})",
    )
    p.add_argument("--hc-mult", type=int, default=4, help="streams per token (default: 4)")
    p.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda when available)",
    )
    p.add_argument(
        "--transport",
        default=None,
        help="how the ranks exchange data (cpu: auto, shm, gloo; cuda: auto, symm, "
        "nccl; default: mhc_sp's automatic choice)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads per rank (default: the cores shared out over the ranks)",
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per size (default: 2)")
    p.add_argument(
        "--repeats", type=int, default=20, help="timed calls per size and way (default: 20)"
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="also fit the cost model of `mhc-sp-bench project` to the measurements",
    )
    p.add_argument("--json", help="write the measurements and the recommendation as JSON")
    p.set_defaults(func=run)


# ---- the decision ---------------------------------------------------------------------------


def recommend(rows: list[dict], max_capture: int = 0) -> Optional[int]:
    """The smallest measured token count above ``max_capture`` from which the sharded boundary is
    faster at every larger measured count (rows: ``tokens``, ``sharded_ms``, ``replicated_ms``);
    None when it is not faster at the largest count."""
    best = None
    for row in sorted(rows, key=lambda r: r["tokens"], reverse=True):
        if row["tokens"] <= max_capture or not row["sharded_ms"] < row["replicated_ms"]:
            break
        best = row["tokens"]
    return best


def verdict(rows: list[dict], threshold: Optional[int], tp: int, max_capture: int) -> list[str]:
    """The plain-language conclusion; its last line is ``recommended: ...``."""
    top = max(rows, key=lambda r: r["tokens"])
    if threshold is None:
        return [
            f"Verdict: with SP a boundary was not faster at {top['tokens']} tokens, the "
            f"largest count measured ({top['sharded_ms']:.3g} ms vs "
            f"{top['replicated_ms']:.3g} ms without). "
            f"On this machine SP does not pay off in this range: leave it off, or measure "
            f"larger counts with --tokens.",
            "recommended: leave --sp-threshold unset (SP off)",
        ]
    at = next(r for r in rows if r["tokens"] == threshold)
    below = [r for r in rows if r["tokens"] < threshold and r["tokens"] > max_capture]
    at_threshold = f"{threshold} token" + ("" if threshold == 1 else "s")
    lines = [
        f"Verdict: with SP (the stream split over {tp} ranks) a boundary is faster from "
        f"{at_threshold} on: {at['speedup']:.2f}x at {at_threshold}, "
        f"{top['speedup']:.2f}x at {top['tokens']}."
    ]
    slower = [r for r in below if r["speedup"] <= 1]
    if slower and len(slower) == len(below):
        lines.append(
            f"Below {threshold} tokens SP is slower: there the all-reduce and the mHC "
            f"work repeated on every rank cost less than splitting the stream."
        )
    elif slower:
        lines.append(
            f"Below {threshold} tokens SP is slower at {len(slower)} of the "
            f"{len(below)} sizes measured, so it does not pay off reliably there."
        )
    if max_capture and any(r["tokens"] <= max_capture and r["speedup"] > 1 for r in rows):
        lines.append(
            f"(SP also wins at some sizes up to {max_capture} tokens, but those run as "
            f"CUDA graphs, where SP must not engage.)"
        )
    lines.append(f"recommended: --sp-threshold {threshold}")
    return lines


# ---- measuring ------------------------------------------------------------------------------


def _measure(
    rank: int,
    world: int,
    tokens: list[int],
    H: int,
    n: int,
    warmup: int,
    repeats: int,
    device_type: str,
    transport: Optional[str],
) -> dict:
    """This rank's median seconds per way and token count. The two ways alternate in short
    bursts (and swap order every round) so that drift of a shared machine hits both alike."""
    device = rank_device(device_type)
    import mhc_sp.distributed as msd

    group = msd.init(device=device_type, transport=transport or "auto")
    used = msd.transport(group, device_type)
    rounds = max(1, min(4, repeats))
    per_round = -(-repeats // rounds)
    rows = []
    for k, T in enumerate(tokens, 1):
        paths = boundary_case(T, H, n, rank, world, group, device)
        ways = {"sharded": paths["fused_sharded"], "replicated": paths["fused_replicated"]}
        for _ in range(warmup):
            for fn in ways.values():
                fn()
        samples = {name: [] for name in ways}
        for r in range(rounds):
            for name in list(ways) if r % 2 == 0 else list(ways)[::-1]:
                samples[name].append(time_across_ranks(ways[name], device, 0, per_round))
        row = {"tokens": T, **{name: statistics.median(s) for name, s in samples.items()}}
        rows.append(row)
        if rank == 0:
            print(
                f"tune: measured {T} tokens ({k}/{len(tokens)}), rank 0: with SP "
                f"{1e3 * row['sharded']:.3g} ms, without {1e3 * row['replicated']:.3g} ms",
                file=sys.stderr,
                flush=True,
            )
    return {"transport": used, "rows": rows}


def measure(
    tp: int,
    tokens: list[int],
    H: int,
    n: int,
    warmup: int,
    repeats: int,
    device: torch.device,
    transport: Optional[str],
    threads: Optional[int],
) -> tuple:
    """Spawn ``tp`` ranks and time both ways; returns (rows, transport, threads per rank)."""
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    threads = threads or max(1, (os.cpu_count() or 1) // tp)
    tunables = device.type == "cpu" and "GLIBC_TUNABLES" not in os.environ
    if tunables:
        os.environ["GLIBC_TUNABLES"] = GLIBC_TUNABLES  # read by the ranks as they start
    try:
        per_rank = run_world(
            tp,
            _measure,
            tokens,
            H,
            n,
            warmup,
            repeats,
            device.type,
            transport,
            backend=backend,
            threads=threads,
            timeout=900,
        )
    finally:
        if tunables:
            del os.environ["GLIBC_TUNABLES"]
    rows = []
    for i, T in enumerate(tokens):
        # A boundary is as slow as its slowest rank.
        sharded = max(r["rows"][i]["sharded"] for r in per_rank)
        replicated = max(r["rows"][i]["replicated"] for r in per_rank)
        rows.append(
            {
                "tokens": T,
                "sharded_ms": 1e3 * sharded,
                "replicated_ms": 1e3 * replicated,
                "speedup": replicated / sharded,
            }
        )
    return rows, per_rank[0]["transport"], threads


# ---- the command ----------------------------------------------------------------------------


def run(args) -> int:
    device = torch.device(args.device)
    tp, H = args.tensor_parallel_size, args.hidden_size
    max_capture = args.max_cudagraph_capture_size
    if tp < 2:
        report.usage_error("tune", f"--tensor-parallel-size: SP needs at least 2 ranks, got {tp}")
    if device.type == "cuda" and tp > torch.cuda.device_count():
        report.usage_error(
            "tune",
            f"--tensor-parallel-size {tp} needs that many GPUs, found {torch.cuda.device_count()}",
        )
    if args.transport is not None:
        import mhc_sp.distributed as msd

        allowed = msd.TRANSPORTS[device.type]
        if args.transport not in allowed:
            report.usage_error(
                "tune",
                f"--transport: expected one of {', '.join(allowed)} on "
                f"{device.type}, got {args.transport!r}",
            )
    if args.warmup < 0 or args.repeats < 1:
        report.usage_error(
            "tune",
            f"--warmup must be >= 0 and --repeats >= 1, got {args.warmup} and {args.repeats}",
        )
    tokens = sorted(set(t for t in args.tokens if t > 0))
    if max_capture and max_capture + 1 not in tokens:
        tokens = sorted(tokens + [max_capture + 1])  # the smallest threshold the engine accepts
    if not tokens:
        report.usage_error("tune", f"--tokens: expected positive counts, got {args.tokens}")
    print(
        f"tune: timing one layer boundary with and without SP at {len(tokens)} token counts "
        f"on {tp} {device.type} ranks (starting the ranks takes a few seconds) ...",
        file=sys.stderr,
        flush=True,
    )
    try:
        rows, transport, threads = measure(
            tp,
            tokens,
            H,
            args.hc_mult,
            args.warmup,
            args.repeats,
            device,
            args.transport,
            args.threads,
        )
    except AssertionError as e:  # a rank failed: its traceback, no second one from here
        print(f"mhc-sp-bench tune: {e}", file=sys.stderr)
        return 1
    threshold = recommend(rows, max_capture)
    lines = verdict(rows, threshold, tp, max_capture)

    print(f"# {report.command_line()}")
    print(
        f"Sequence parallelism (SP) at one layer boundary, the step between two sublayers that "
        f"every token\ntakes twice per layer: hidden {H}, {args.hc_mult} streams, {tp} ranks on "
        f"{device.type} (transport {transport}, {threads} thread(s) per rank).\nEach time is "
        f"the median of {args.repeats} calls on the slowest rank."
    )
    print(f"  with SP:    reduce-scatter, mHC on 1/{tp} of the tokens per rank, all-gather")
    print("  without SP: all-reduce, mHC on every token on every rank")
    table = [
        {
            "tokens": r["tokens"],
            "with SP (ms)": r["sharded_ms"],
            "without SP (ms)": r["replicated_ms"],
            "SP speedup (x)": r["speedup"],
            "faster": "with SP" if r["speedup"] > 1 else "without SP",
        }
        for r in rows
    ]
    print(report.format_table(table, list(table[0])))
    calibrated = None
    if args.calibrate:
        calibrated = _calibrated(rows, tp, H, args.hc_mult, max_capture)
        print(calibrated["line"])
    print("\n".join(lines))
    if args.json:
        doc = report.document(
            "tune",
            rows,
            device,
            extra={
                "tensor_parallel_size": tp,
                "hidden_size": H,
                "hc_mult": args.hc_mult,
                "transport": transport,
                "threads_per_rank": threads,
                "repeats": args.repeats,
                "max_cudagraph_capture_size": max_capture,
                "recommended_sp_threshold": threshold,
                "verdict": lines,
                "calibrated": calibrated,
            },
        )
        report.write_json(doc, args.json)
    return 0


def _calibrated(rows: list[dict], tp: int, H: int, n: int, max_capture: int) -> dict:
    """``project``'s cost model fitted to the measured rows, and the crossover it predicts."""
    from dataclasses import asdict

    from .project_cmd import calibrate, recommend_threshold

    layer_rows = [
        {
            "tp": tp,
            "tokens": r["tokens"],
            "hidden": H,
            "fused_sharded_us": 1e3 * r["sharded_ms"],
            "fused_replicated_us": 1e3 * r["replicated_ms"],
        }
        for r in rows
    ]
    try:
        machine = calibrate(layer_rows, n)
    except ValueError as e:
        return {"machine": None, "recommended_sp_threshold": None, "line": f"cost model: {e}"}
    threshold = recommend_threshold(H, n, tp, machine, max_capture)
    where = f"from {threshold} tokens" if threshold else "at no token count"
    line = (
        f"cost model fitted to these times (latency {machine.link_latency_us:.3g} us per step, "
        f"link {machine.link_gbps:.3g} GB/s, memory {machine.hbm_gbps:.3g} GB/s, launch "
        f"{machine.launch_us:.3g} us): SP pays off {where}"
    )
    return {"machine": asdict(machine), "recommended_sp_threshold": threshold, "line": line}
