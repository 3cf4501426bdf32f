# SPDX-License-Identifier: Apache-2.0
"""``mhc-sp-bench model``: run the DeepSeek-V4-style model on tp x pp ranks, report per-phase
timings, whether SP engaged, and the MTP draft steps (each a forward with its own SP decision);
``--check`` compares the logits and every draft step with the tp=1 model.

Launching: with ``--device cpu`` it spawns tp*pp gloo ranks; with ``--device cuda`` one process per
GPU (NCCL for the ops, gloo for the small Python-side objects); started under ``torchrun`` it uses
the given ranks instead (the world size must be tp*pp).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from typing import Optional

from ..config import EngineArgs, EngineConfig
from ..config.engine_args import non_negative_int, positive_int
from ..launch import run_world
from ..profiling import profiled
from . import report

PREFIX = "mhc-sp-bench model"


def register(subparsers) -> None:
    """Add the ``model`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "model",
        help="run the V4-style model with TP/PP/SP (and MTP drafts) and report timings",
        description="Run one forward (plus warm-up and timed repeats) of the DeepSeek-V4-style "
        "model on tp x pp ranks and report per-phase timings and whether SP engaged. "
        "With --num-speculative-tokens K the MTP layer then drafts K tokens, each step "
        "a forward of its own. --check compares the logits and every draft step with "
        "the tp=1 model on the same weights (MoE routing and drafted tokens replayed "
        "from the TP run) and exits 1 above tolerance. Configuration errors exit 2.",
    )
    EngineArgs.add_cli_args(p)
    run = p.add_argument_group("this run")
    run.add_argument(
        "--tokens",
        type=positive_int,
        default=64,
        help="tokens in the forward (default: %(default)s)",
    )
    run.add_argument(
        "--requests",
        type=positive_int,
        default=1,
        help="the tokens form this many requests of equal length; draft steps after "
        "the first run on the last token of each (default: %(default)s)",
    )
    run.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the ranks run (default: %(default)s)",
    )
    run.add_argument(
        "--warmup",
        type=non_negative_int,
        default=1,
        help="untimed forwards first (default: %(default)s)",
    )
    run.add_argument(
        "--iters", type=non_negative_int, default=3, help="timed forwards (default: %(default)s)"
    )
    run.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds before the spawned ranks are killed (default: %(default)s)",
    )
    run.add_argument(
        "--check",
        action="store_true",
        help="compare the logits and each draft step with tp=1; print "
        "max_abs_diff=<value>; exit 1 above tolerance",
    )
    run.add_argument("--json", help="write the run's summary (plans, phase times, check) as JSON")
    run.add_argument(
        "--profile",
        choices=("nsys", "torch"),
        help="bracket the timed forwards on rank 0 for nsys (cudaProfilerApi) or torch.profiler",
    )
    run.add_argument(
        "--trace", default="mhc_sp_trace.json", help="--profile torch output (Chrome trace)"
    )
    p.set_defaults(func=run_model)


def build_engine(args: argparse.Namespace, world_size: Optional[int] = None) -> EngineConfig:
    """The validated EngineConfig of the command line (raises ValueError / NotImplementedError
    naming the offending values)."""
    if args.requests > args.tokens:
        raise ValueError(f"--requests {args.requests} must be <= --tokens {args.tokens}")
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


def _error(message: str) -> int:
    print(f"{PREFIX}: error: {message}", file=sys.stderr)
    return 2


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def run_model(args: argparse.Namespace) -> int:
    """The ``model`` subcommand: 0 = ok, 1 = check failed or a rank failed, 2 = configuration
    error."""
    started = int(os.environ["WORLD_SIZE"]) if _under_torchrun() else None
    try:
        engine = build_engine(args, started)
    except (ValueError, TypeError, NotImplementedError) as e:
        return _error(str(e))
    world = engine.parallel.world_size
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return _error("--device cuda: no CUDA device is available")
        if not _under_torchrun() and torch.cuda.device_count() < world:
            return _error(
                f"--device cuda: tensor_parallel_size x pipeline_parallel_size = {world} "
                f"ranks need {world} GPUs, found {torch.cuda.device_count()}"
            )
    if _under_torchrun():
        rank = int(os.environ["RANK"])
        return _finish(args, [_rank_main(rank, world, "env://", args, engine)])
    if world == 1:
        return _finish(args, [_rank_main(0, 1, None, args, engine)])
    return _spawn(world, args, engine)


# ---- launching ------------------------------------------------------------------------------


def _finish(args, results: list[dict]) -> int:
    """Print the reporting rank's lines, write --json; the exit code of the worst rank."""
    for result in results:
        if result.get("report"):
            print("\n".join(result["report"]), flush=True)
        if result.get("summary") and args.json:
            import torch

            doc = report.document(
                "model",
                [result["summary"]],
                torch.device(args.device),
                argv=getattr(args, "argv", None),
            )
            report.write_json(doc, args.json)
    return max(result["code"] for result in results)


def _spawn(world: int, args, engine) -> int:
    """Run ``world`` ranks as spawned processes; print the reporting rank's report."""
    backend = "cpu:gloo,cuda:nccl" if args.device == "cuda" else "gloo"
    try:
        results = run_world(
            world,
            _rank_main,
            None,
            args,
            engine,
            timeout=args.timeout,
            backend=backend,
            threads=None,
            collective_timeout=max(60.0, args.timeout),
        )
    except AssertionError as e:
        print(f"{PREFIX}: {e}", file=sys.stderr)
        return 1
    return _finish(args, results)


# ---- one rank -------------------------------------------------------------------------------


def _rank_main(
    rank: int, world: int, init_method: Optional[str], args, engine: EngineConfig
) -> dict:
    """Run the benchmark on this rank. Returns ``{"code": int, "report": [lines] or None}``; only
    the reporting rank (TP rank 0 of the last stage) has a report."""
    import torch
    import torch.distributed as dist

    from .. import distributed as msd
    from ..model import RoutingTrace
    from ..profiling import PhaseTimer
    from ..runner import ModelRunner, init_parallel_groups

    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        # Ranks share the machine's cores.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
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
        cfg, steps = engine.model, engine.num_speculative_tokens
        gen = torch.Generator().manual_seed(args.seed + 1)
        ids = torch.randint(0, cfg.vocab_size, (args.tokens,), generator=gen)
        # The MTP layer predicts one token further: feed it each position's next token.
        next_ids = torch.randint(0, cfg.vocab_size, (args.tokens,), generator=gen)
        rows = last_token_indices(args.tokens, args.requests)

        def step(timer=None, routing=None):
            out = runner.forward(ids, return_final_stream=steps > 0, timer=timer, routing=routing)
            drafts = (
                runner.propose(
                    out.final_stream,
                    next_ids,
                    last_token_indices=rows,
                    timer=timer,
                    routing=routing,
                )
                if steps
                else None
            )
            return out, drafts

        for _ in range(args.warmup):
            step()
        timer = PhaseTimer(sync_cuda=device.type == "cuda")
        total = 0.0
        with profiled(args.profile if rank == 0 else None, args.trace):  # rank 0 feeds a profiler
            for _ in range(args.iters):
                out, drafts = step(timer)
                total += out.timings["total"]
                total += drafts.timings.get("total", 0.0) if drafts else 0.0
        plan = runner.plan(args.tokens)
        reporting = groups.tp.rank == 0 and runner.is_last_stage
        stage_phases = [dict(timer.totals)]
        if dist.is_initialized() and groups.pp_size > 1:
            stage_phases = [None] * groups.pp_size
            dist.all_gather_object(stage_phases, dict(timer.totals), group=groups.pp_group)

        check_lines, code, diffs = [], 0, None
        if args.check:
            trace = RoutingTrace()
            out, drafts = step(routing=trace)
            recorded = [t.cpu() for t in trace.recorded]
            if dist.is_initialized() and groups.pp_size > 1:
                per_stage = [None] * groups.pp_size
                dist.all_gather_object(per_stage, recorded, group=groups.pp_group)
                recorded = [t for stage in per_stage for t in stage]
            if reporting:
                check_lines, code, diffs = _check(
                    engine, groups, device, ids, next_ids, rows, out, drafts, recorded
                )
        report_lines = summary = None
        if reporting:
            draft_plans = drafts.plans if drafts else []
            report_lines = _report(args, engine, plan, draft_plans, stage_phases, total)
            report_lines += check_lines
            iters = max(1, args.iters)
            summary = {
                "tp": engine.parallel.tensor_parallel_size,
                "pp": engine.parallel.pipeline_parallel_size,
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
                "total_ms": 1e3 * total / iters,
                "phases_ms": [{k: 1e3 * v / iters for k, v in ph.items()} for ph in stage_phases],
                "max_abs_diff": max(diffs.values()) if diffs else None,
                "max_abs_diff_by_output": diffs,
                "check_passed": (code == 0) if args.check else None,
            }
        if dist.is_initialized():
            dist.barrier()
        return {"code": code, "report": report_lines, "summary": summary}
    finally:
        msd.destroy()
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _check(engine, groups, device, ids, next_ids, rows, out, drafts, recorded):
    """Compare this run's logits and draft steps with the tp=1, pp=1 model on the same weights, on
    this rank: the reference replays this run's MoE routing and is fed this run's drafted tokens,
    so what is compared is the arithmetic of each step, not near-tie choices."""
    import dataclasses

    from ..config import ParallelConfig, PassConfig
    from ..model import RoutingTrace, TPContext
    from ..runner import ModelRunner, ParallelGroups, logits_tolerance

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
    iters = max(1, args.iters)

    def sp(pl) -> str:
        if pl.sharded:
            rows = -(-pl.padded_tokens // p.tensor_parallel_size)
            return f"yes (token-sharded: {rows} stream rows per rank)"
        return "no" + ("" if p.enable_sp else " (SP not configured)")

    lines = [
        f"{PREFIX}: tp={p.tensor_parallel_size} pp={p.pipeline_parallel_size} device={args.device} "
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
