# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench model: run the DeepSeek-V4-style model on tp x pp ranks, report per-phase
timings, whether SP engaged, and the MTP draft steps (each a forward with its own SP decision);
--check compares the logits and every draft step with the tp=1 model.

Launching: with --device cpu it spawns tp*pp gloo ranks; with --device cuda one process per GPU
(NCCL for the ops, gloo for the small Python-side objects); started under torchrun it uses the
given ranks instead (the world size must be tp*pp).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from typing import Optional

from ..engine.config import EngineArgs, EngineConfig, arg_types
from ..local_world import run_world
from ..profiling import profiled
from . import checks, flags, machine, report


def register(subparsers) -> None:
    """Add the ``model`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "model",
        help="run the V4-style model with TP/PP/SP (and MTP drafts) and report timings",
        description="Run forwards (warm-up, then timed repeats) of the DeepSeek-V4-style model "
        "on tp x pp ranks at each --tokens count and report per-phase timings and whether SP "
        "engaged. With --num-speculative-tokens K the MTP layer then drafts K tokens, each "
        "step a forward of its own. --check compares the logits and every draft step with the "
        "tp=1 model on the same weights (MoE routing and drafted tokens replayed from the TP "
        "run) and exits 1 above tolerance. Configuration errors exit 2.",
    )
    EngineArgs.add_cli_args(p)
    this_run = p.add_argument_group("this run")
    flags.add_tokens(this_run, [64], help="tokens in a forward (a comma list: one forward each)")
    this_run.add_argument(
        "--requests",
        type=arg_types.positive_int,
        default=1,
        help="the tokens form this many requests, as equal in length as they divide (earlier "
        "requests take the remainder); draft steps after the first run on the last token of "
        "each",
    )
    flags.add_measuring(this_run, threads=False)
    this_run.add_argument(
        "--timeout",
        type=arg_types.positive_float,
        default=600.0,
        metavar="S",
        help="seconds before the spawned ranks are killed",
    )
    this_run.add_argument(
        "--check",
        action="store_true",
        help="compare the logits and each draft step with tp=1; print "
        "max_abs_diff=<value>; exit 1 above tolerance",
    )
    p.set_defaults(func=run, validate=check)


def check(args: argparse.Namespace) -> None:
    """The engine configuration, validated before any rank starts; the ranks' world."""
    try:
        args.engine = build_engine(
            args, int(os.environ["WORLD_SIZE"]) if _under_torchrun() else None
        )
    except (ValueError, TypeError, NotImplementedError) as e:
        checks.usage_error(args.prog, str(e))
    world = args.engine.parallel.world_size
    if args.device == "cuda" and not _under_torchrun() and machine.gpu_count() < world:
        checks.usage_error(
            args.prog,
            f"--device cuda: tensor_parallel_size x pipeline_parallel_size = {world} "
            f"ranks need {world} GPUs, found {machine.gpu_count()}",
        )
    # One rank runs in this process (alone, or as a torchrun rank); more are spawned.
    args.measures = "here" if world == 1 or _under_torchrun() else "ranks"
    if args.measures == "ranks":
        machine.warn_oversubscribed(args.prog, world, machine.threads_per_rank(world, None))


def build_engine(args: argparse.Namespace, world_size: Optional[int] = None) -> EngineConfig:
    """The validated EngineConfig of the command line (raises ValueError / NotImplementedError
    naming the offending values)."""
    if args.requests > min(args.tokens):
        raise ValueError(f"--requests {args.requests} must be <= --tokens {min(args.tokens)}")
    return EngineArgs.from_cli_args(args).create_engine_config(world_size)


def last_token_indices(tokens: int, requests: int) -> list[int]:
    """The last token of each of ``requests`` requests laid out back to back over ``tokens``
    tokens, as even as possible (earlier requests take the remainder)."""
    base, extra = divmod(tokens, requests)
    ends, end = [], 0
    for r in range(requests):
        end += base + (1 if r < extra else 0)
        ends.append(end - 1)
    return ends


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def run(args: argparse.Namespace) -> int:
    """The ``model`` subcommand: 0 = ok, 1 = check failed or a rank failed (configuration errors
    exit 2 from :func:`check`)."""
    engine = args.engine
    world = engine.parallel.world_size
    if not _under_torchrun() or os.environ["RANK"] == "0":
        print(
            f"model: {len(args.tokens)} token count(s) x ({args.warmup} warm-up + "
            f"{args.repeats} timed forwards) on {world} {args.device} rank(s) ...",
            file=sys.stderr,
            flush=True,
        )
    if _under_torchrun():
        rank = int(os.environ["RANK"])
        return _finish(args, [_worker(rank, world, "env://", args, engine)])
    if world == 1:
        return _finish(args, [_worker(0, 1, None, args, engine)])
    return _spawn(world, args, engine)


# ---- launching ------------------------------------------------------------------------------


def _finish(args, results: list[dict]) -> int:
    """Print the reporting rank's report and table, write the files; the exit code of the worst
    rank."""
    import torch

    for result in results:
        if result.get("rows"):
            doc = report.document(
                "model",
                result["rows"],
                torch.device(args.device),
                extra={"warmup": args.warmup, "repeats": args.repeats},
                argv=args.argv,
            )
            report.publish(doc, args, lambda doc: (result["report"], COLUMNS, [], plot))
    return max(result["code"] for result in results)


def _spawn(world: int, args, engine) -> int:
    """Run ``world`` ranks as spawned processes; print the reporting rank's report."""
    backend = "cpu:gloo,cuda:nccl" if args.device == "cuda" else "gloo"
    try:
        results = run_world(
            world,
            _worker,
            None,
            args,
            engine,
            timeout=args.timeout,
            backend=backend,
            threads=None,
            collective_timeout=max(60.0, args.timeout),
        )
    except AssertionError as e:
        print(f"{args.prog}: {e}", file=sys.stderr)
        return 1
    return _finish(args, results)


#: The table of a model run: one row per token count.
COLUMNS = [
    report.col("tokens"),
    report.col("padded_tokens"),
    report.col("sp_engaged"),
    report.col("total_ms", "total_ms (per forward)"),
    report.col("max_abs_diff"),
    report.col("check_passed"),
]


def present(doc: dict) -> tuple:
    return [], COLUMNS, [], plot


def plot(ax, doc: dict) -> None:
    rows = doc["rows"]
    tokens = [r["tokens"] for r in rows]
    ax.plot(tokens, [r["total_ms"] for r in rows], color="0.5", linewidth=1)
    for engaged, marker, label in ((True, "o", "SP engaged"), (False, "x", "SP not engaged")):
        pts = [(r["tokens"], r["total_ms"]) for r in rows if r["sp_engaged"] == engaged]
        if pts:
            ax.plot(*zip(*pts), marker=marker, linestyle="none", label=label)
    threshold = rows[0].get("sp_threshold") if rows else None
    report.mark_crossover(ax, threshold, f"--sp-threshold {threshold}")
    report.log2_tokens_axis(ax, "tokens per forward")
    ax.set_ylabel("ms per forward (mean; drafts included)")
    ax.legend(fontsize=8)


# ---- one rank -------------------------------------------------------------------------------


def _worker(rank: int, world: int, init_method: Optional[str], args, engine: EngineConfig) -> dict:
    """Run the benchmark on this rank, one token count after the other. Returns ``{"code": int,
    "report": [lines], "rows": [one summary per count]}``; only the reporting rank (TP rank 0 of
    the last stage) has a report and rows."""
    import torch
    import torch.distributed as dist

    from .. import distributed as msd
    from ..engine.runner import ModelRunner, init_parallel_groups

    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(machine.threads_per_rank(world, None))  # ranks share the cores
    if world > 1 and not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if args.device == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=max(60.0, args.timeout)),
        )
    try:
        groups = init_parallel_groups(engine.parallel, device)
        runner = ModelRunner(engine, groups, device)
        code, lines, rows = 0, [], []
        with profiled(args.profile if rank == 0 else None, args.trace):  # rank 0 feeds a profiler
            for k, T in enumerate(args.tokens, 1):
                result = _run_tokens(T, args, engine, groups, runner, device)
                if rank == 0:
                    print(f"model: {T} tokens done ({k}/{len(args.tokens)})", file=sys.stderr)
                code = max(code, result["code"])
                if result["summary"] is not None:
                    lines += result["report"]
                    rows.append(result["summary"])
        if dist.is_initialized():
            dist.barrier()
        return {"code": code, "report": lines, "rows": rows}
    finally:
        msd.destroy()
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _run_tokens(T: int, args, engine: EngineConfig, groups, runner, device) -> dict:
    """Warm-up, timed repeats and the check of forwards of ``T`` tokens on this rank: ``{"code",
    "report", "summary"}``, the last two None except on the reporting rank."""
    inputs = _inputs(T, args, engine)
    step = _step(runner, inputs, engine.num_speculative_tokens)
    for _ in range(args.warmup):
        step()
    timer, total, drafts = _timed(step, args.repeats, device)
    stage_phases = _stage_phases(timer, groups)
    reporting = groups.tp.rank == 0 and runner.is_last_stage
    check_lines, code, diffs = [], 0, None
    if args.check:
        check_lines, code, diffs, drafts = _checked(step, engine, groups, device, inputs, reporting)
    if not reporting:
        return {"code": code, "report": None, "summary": None}
    plan = runner.plan(T)
    draft_plans = drafts.plans if drafts else []
    lines = _report(args, engine, plan, draft_plans, stage_phases, total)
    summary = _summary(args, engine, plan, draft_plans, stage_phases, total, diffs, code)
    return {"code": code, "report": lines + check_lines, "summary": summary}


def _inputs(T: int, args, engine: EngineConfig) -> dict:
    """Seeded token ids of one forward, the next token of each position (what the MTP layer is
    fed), and the last token of each request."""
    import torch

    gen = torch.Generator().manual_seed(args.seed + 1)
    vocab = engine.model.vocab_size
    ids = torch.randint(0, vocab, (T,), generator=gen)
    next_ids = torch.randint(0, vocab, (T,), generator=gen)
    return {"ids": ids, "next_ids": next_ids, "rows": last_token_indices(T, args.requests)}


def _step(runner, inputs: dict, steps: int):
    """One forward and its ``steps`` MTP draft steps: ``step(timer, routing) -> (out, drafts)``."""

    def step(timer=None, routing=None):
        out = runner.forward(
            inputs["ids"], return_final_stream=steps > 0, timer=timer, routing=routing
        )
        drafts = None
        if steps:
            drafts = runner.propose(
                out.final_stream,
                inputs["next_ids"],
                last_token_indices=inputs["rows"],
                timer=timer,
                routing=routing,
            )
        return out, drafts

    return step


def _timed(step, repeats: int, device) -> tuple:
    """``repeats`` timed steps: the phase timer, the wall time in all (drafts included), and the
    last step's drafts."""
    from ..profiling import PhaseTimer

    timer = PhaseTimer(sync_cuda=device.type == "cuda")
    total = 0.0
    for _ in range(repeats):
        out, drafts = step(timer)
        total += out.timings["total"] + (drafts.timings.get("total", 0.0) if drafts else 0.0)
    return timer, total, drafts


def _stage_phases(timer, groups) -> list[dict]:
    """Every pipeline stage's phase totals (TP rank 0's of each stage)."""
    import torch.distributed as dist

    phases = [dict(timer.totals)]
    if dist.is_initialized() and groups.pp_size > 1:
        phases = [None] * groups.pp_size
        dist.all_gather_object(phases, dict(timer.totals), group=groups.pp_group)
    return phases


def _checked(step, engine, groups, device, inputs: dict, reporting: bool) -> tuple:
    """One more step with its MoE routing recorded (every stage's), compared on the reporting
    rank with tp=1 (:func:`_check`): (lines, code, diffs, drafts)."""
    import torch.distributed as dist

    from ..engine.model import RoutingTrace

    trace = RoutingTrace()
    out, drafts = step(routing=trace)
    recorded = [t.cpu() for t in trace.recorded]
    if dist.is_initialized() and groups.pp_size > 1:
        per_stage = [None] * groups.pp_size
        dist.all_gather_object(per_stage, recorded, group=groups.pp_group)
        recorded = [t for stage in per_stage for t in stage]
    if not reporting:
        return [], 0, None, drafts
    ids, next_ids, rows = inputs["ids"], inputs["next_ids"], inputs["rows"]
    lines, code, diffs = _check(engine, groups, device, ids, next_ids, rows, out, drafts, recorded)
    return lines, code, diffs, drafts


def _summary(args, engine, plan, draft_plans, stage_phases, total, diffs, code) -> dict:
    """The reporting rank's row of one token count."""
    return {
        "tp": engine.parallel.tensor_parallel_size,
        "pp": engine.parallel.pipeline_parallel_size,
        "sp_threshold": engine.parallel.sp_threshold,
        "tokens": plan.num_tokens,
        "padded_tokens": plan.padded_tokens,
        "sp_engaged": plan.sharded,
        "cudagraph_size": plan.graph_size,
        "draft_steps": [
            {
                "tokens": p.num_tokens,
                "padded_tokens": p.padded_tokens,
                "sp_engaged": p.sharded,
                "cudagraph_size": p.graph_size,
            }
            for p in draft_plans
        ],
        "total_ms": 1e3 * total / args.repeats,
        "phases_ms": [{k: 1e3 * v / args.repeats for k, v in ph.items()} for ph in stage_phases],
        "max_abs_diff": max(diffs.values()) if diffs else None,
        "max_abs_diff_by_output": diffs,
        "check_passed": (code == 0) if args.check else None,
    }


def _check(engine, groups, device, ids, next_ids, rows, out, drafts, recorded):
    """Compare this run's logits and draft steps with the tp=1, pp=1 model on the same weights, on
    this rank: the reference replays this run's MoE routing and is fed this run's drafted tokens,
    so what is compared is the arithmetic of each step, not near-tie choices."""
    import dataclasses

    from ..engine.config import ParallelConfig, PassConfig
    from ..engine.model import RoutingTrace, TPContext
    from ..engine.runner import ModelRunner, ParallelGroups, logits_tolerance

    one = ParallelGroups(TPContext(0, 1, groups.self_group), self_group=groups.self_group)
    # tp = 1 without the compile pass (the engine switches it off at tp = 1, with a warning).
    ref_compilation = dataclasses.replace(engine.compilation, pass_config=PassConfig())
    ref_engine = dataclasses.replace(engine, parallel=ParallelConfig(), compilation=ref_compilation)
    ref = ModelRunner(ref_engine, one, device)
    free = RoutingTrace()
    ref.forward(ids, routing=free)
    replay = RoutingTrace(replay=[t.to(device) for t in recorded])
    steps = engine.num_speculative_tokens
    r = ref.forward(ids, return_final_stream=steps > 0, routing=replay)
    compared = [("logits", out.logits, r.logits, engine.model.num_layers)]
    if steps:
        dr = ref.propose(
            r.final_stream,
            next_ids,
            last_token_indices=rows,
            draft_tokens=drafts.tokens,
            routing=replay,
        )
        compared += [
            (f"draft step {j}", x, y, engine.model.num_layers + j + 1)
            for j, (x, y) in enumerate(zip(drafts.logits, dr.logits))
        ]
    choices = sum(t.numel() for t in free.recorded)
    differ = sum(
        int((a[: b.shape[0]].sort(-1).values.cpu() != b.sort(-1).values.cpu()).sum())
        for a, b in zip(recorded, free.recorded)
    )
    lines, diffs, ok = [], {}, True
    for name, x, y, depth in compared:
        diff, tol = (x - y).abs().max().item(), logits_tolerance(depth, y)
        diffs[name] = diff
        ok = ok and diff <= tol
        lines.append(f"  {name}: max_abs_diff {diff:.4g} (tolerance {tol:.4g})")
    worst = max(diffs.values())
    lines = [
        f"max_abs_diff={worst:.6g}",
        f"check: {'PASS' if ok else 'FAIL'} against tp=1, pp=1 on the same weights (MoE "
        f"routing and drafted tokens replayed from this run; {differ}/{choices} expert "
        f"choices of the main forward differ from free tp=1 routing):",
    ] + lines
    return lines, 0 if ok else 1, diffs


def _report(args, engine, plan, draft_plans, stage_phases, total) -> list[str]:
    p, m = engine.parallel, engine.model
    iters = args.repeats

    def sp(pl) -> str:
        if pl.sharded:
            rows = -(-pl.padded_tokens // p.tensor_parallel_size)
            return f"yes (token-sharded: {rows} stream rows per rank)"
        return "no" + ("" if p.enable_sp else " (SP not configured)")

    lines = [
        f"{args.prog}: tp={p.tensor_parallel_size} pp={p.pipeline_parallel_size} "
        f"device={args.device} "
        f"layers={m.num_layers} hidden={m.hidden_size} heads={m.num_heads} "
        f"experts={m.num_routed_experts} top_k={m.num_experts_per_tok} "
        f"draft_steps={engine.num_speculative_tokens}",
        f"tokens={plan.num_tokens} padded={plan.padded_tokens} sp_threshold={p.sp_threshold} "
        f"cudagraph={plan.graph_size if plan.graph_size is not None else 'off'}",
        f"SP engaged: {sp(plan)}",
    ]
    for j, d in enumerate(draft_plans):
        lines.append(
            f"MTP draft step {j}: tokens={d.num_tokens} padded={d.padded_tokens} "
            f"SP engaged: {sp(d)}"
        )
    lines.append(f"per-phase time, ms per forward (mean of {iters}; TP rank 0 of each stage):")
    for stage, phases in enumerate(stage_phases):
        parts = "  ".join(f"{k} {1e3 * v / iters:.3f}" for k, v in phases.items())
        lines.append(f"  stage {stage}: {parts}")
    lines.append(f"  total {1e3 * total / iters:.3f} (last stage, wall, drafts included)")
    return lines
