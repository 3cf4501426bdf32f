"""``mhc-sp-bench model``: run the DeepSeek-V4-style model on tp x pp ranks, report per-phase
timings and whether SP engaged; ``--check`` compares the logits with the tp=1 model.

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

from ..config import CompilationConfig, EngineConfig, ModelConfig, ParallelConfig
from ..launch import run_world
from ..profiling import profiled
from . import report

PREFIX = "mhc-sp-bench model"


def register(subparsers) -> None:
    """Add the ``model`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "model", help="run the V4-style model with TP/PP/SP and report timings",
        description="Run one forward (plus warm-up and timed repeats) of the DeepSeek-V4-style "
                    "model on tp x pp ranks and report per-phase timings and whether SP engaged. "
                    "--check compares the logits against the tp=1 model on the same weights "
                    "(MoE routing replayed from the TP run) and exits 1 above tolerance. "
                    "Configuration errors exit 2.")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default 1)")
    p.add_argument("--tokens", type=int, default=64, help="tokens in the forward (default 64)")
    p.add_argument("--sp-threshold", type=int, default=None,
                   help="SP engages on forwards with at least this many (padded) tokens (default: no SP)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    p.add_argument("--hidden", type=int, default=96, help="hidden size (default 96)")
    p.add_argument("--heads", type=int, default=None,
                   help="attention heads (default: hidden/64 from 1024 up, else hidden/8)")
    p.add_argument("--experts", type=int, default=8, help="routed experts (default 8)")
    p.add_argument("--top-k", type=int, default=2, help="experts per token (default 2)")
    p.add_argument("--moe-intermediate", type=int, default=None,
                   help="expert intermediate size (default hidden/2)")
    p.add_argument("--vocab", type=int, default=840, help="vocabulary size (default 840)")
    p.add_argument("--moe-backend", default="naive", help="MoE backend: naive or capacity")
    p.add_argument("--mtp", action="store_true", help="also run the MTP draft layer")
    p.add_argument("--max-cudagraph-capture-size", type=int, default=0,
                   help="capture CUDA graphs up to this many tokens (default 0: none; CUDA only)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs, eager SP path")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default cpu")
    p.add_argument("--seed", type=int, default=0, help="weights and input seed (default 0)")
    p.add_argument("--warmup", type=int, default=1, help="untimed forwards first (default 1)")
    p.add_argument("--iters", type=int, default=3, help="timed forwards (default 3)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds before the spawned ranks are killed (default 600)")
    p.add_argument("--check", action="store_true",
                   help="compare the logits with tp=1; print max_abs_diff=<value>; exit 1 above tolerance")
    p.add_argument("--json", help="write the run's summary (plan, phase times, check) as JSON")
    p.add_argument("--profile", choices=("nsys", "torch"),
                   help="bracket the timed forwards on rank 0 for nsys (cudaProfilerApi) or torch.profiler")
    p.add_argument("--trace", default="mhc_sp_trace.json", help="--profile torch output (Chrome trace)")
    p.set_defaults(func=run)


def build_engine(args: argparse.Namespace) -> EngineConfig:
    """The validated EngineConfig of the command line (raises ValueError / NotImplementedError
    naming the offending values)."""
    for name in ("tokens", "warmup", "iters"):
        value = getattr(args, name)
        if value < (1 if name == "tokens" else 0):
            raise ValueError(f"--{name} must be {'>= 1' if name == 'tokens' else '>= 0'}, got {value}")
    if args.hidden < 1:
        raise ValueError(f"--hidden must be >= 1, got {args.hidden}")
    heads = args.heads if args.heads is not None else max(1, args.hidden // (64 if args.hidden >= 1024 else 8))
    inter = args.moe_intermediate if args.moe_intermediate is not None else max(1, args.hidden // 2)
    model = ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                        num_heads=heads, num_routed_experts=args.experts,
                        num_experts_per_tok=args.top_k, moe_intermediate_size=inter,
                        num_mtp_layers=1 if args.mtp else 0, seed=args.seed)
    return EngineConfig(model=model,
                        parallel=ParallelConfig(args.tp, args.pp, args.sp_threshold),
                        compilation=CompilationConfig(
                            max_cudagraph_capture_size=args.max_cudagraph_capture_size),
                        enforce_eager=args.enforce_eager, moe_backend=args.moe_backend)


def _error(message: str) -> int:
    print(f"{PREFIX}: error: {message}", file=sys.stderr)
    return 2


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def run(args: argparse.Namespace) -> int:
    """The ``model`` subcommand: 0 = ok, 1 = check failed or a rank failed, 2 = configuration error."""
    try:
        engine = build_engine(args)
    except (ValueError, TypeError, NotImplementedError) as e:
        return _error(str(e))
    world = engine.parallel.world_size
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return _error("--device cuda: no CUDA device is available")
        if not _under_torchrun() and torch.cuda.device_count() < world:
            return _error(f"--device cuda: tp*pp={world} ranks need {world} GPUs, "
                          f"found {torch.cuda.device_count()}")
    if _under_torchrun():
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if size != world:
            return _error(f"torchrun started {size} ranks but --tp {args.tp} x --pp {args.pp} = {world}")
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

            doc = report.document("model", [result["summary"]], torch.device(args.device),
                                  argv=getattr(args, "argv", None))
            report.write_json(doc, args.json)
    return max(result["code"] for result in results)


def _spawn(world: int, args, engine) -> int:
    """Run ``world`` ranks as spawned processes; print the reporting rank's report."""
    backend = "cpu:gloo,cuda:nccl" if args.device == "cuda" else "gloo"
    try:
        results = run_world(world, _rank_main, None, args, engine, timeout=args.timeout, backend=backend,
                            threads=None, collective_timeout=max(60.0, args.timeout))
    except AssertionError as e:
        print(f"{PREFIX}: {e}", file=sys.stderr)
        return 1
    return _finish(args, results)


# ---- one rank -------------------------------------------------------------------------------

def _rank_main(rank: int, world: int, init_method: Optional[str], args, engine: EngineConfig) -> dict:
    """Run the benchmark on this rank. Returns ``{"code": int, "report": [lines] or None}``; only the
    reporting rank (TP rank 0 of the last stage) has a report."""
    import torch
    import torch.distributed as dist

    from .. import distributed as msd
    from ..model import DeepseekV4Model, PhaseTimer, RoutingTrace, TPContext
    from ..runner import ModelRunner, init_parallel_groups, logits_tolerance

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
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=timedelta(seconds=max(60.0, args.timeout)))
    try:
        groups = init_parallel_groups(engine.parallel, device)
        runner = ModelRunner(engine, groups, device)
        cfg = engine.model
        gen = torch.Generator().manual_seed(args.seed + 1)
        ids = torch.randint(0, cfg.vocab_size, (args.tokens,), generator=gen)
        # The MTP layer predicts one token further: feed it each position's next token.
        mtp_ids = torch.randint(0, cfg.vocab_size, (args.tokens,), generator=gen) if args.mtp else None
        for _ in range(args.warmup):
            runner.forward(ids, mtp_ids)
        timer = PhaseTimer(sync_cuda=device.type == "cuda")
        total = 0.0
        with profiled(args.profile if rank == 0 else None, args.trace):  # rank 0 feeds a profiler
            for _ in range(args.iters):
                out = runner.forward(ids, mtp_ids, timer=timer)
                total += out.timings["total"]
        plan = runner.plan(args.tokens)
        reporting = groups.tp.rank == 0 and runner.is_last_stage
        phases = {k: v for k, v in timer.totals.items()}
        stage_phases = [phases]
        if dist.is_initialized() and groups.pp_size > 1:
            stage_phases = [None] * groups.pp_size
            dist.all_gather_object(stage_phases, phases, group=groups.pp_group)

        check_lines, code, diff = [], 0, None
        if args.check:
            trace = RoutingTrace()
            out = runner.forward(ids, mtp_ids, routing=trace)
            recorded = [t.cpu() for t in trace.recorded]
            if dist.is_initialized() and groups.pp_size > 1:
                per_stage = [None] * groups.pp_size
                dist.all_gather_object(per_stage, recorded, group=groups.pp_group)
                recorded = [t for stage in per_stage for t in stage]
            if reporting:
                check_lines, code, diff = _check(engine, groups, device, ids, mtp_ids, out, recorded,
                                                 DeepseekV4Model, TPContext, RoutingTrace, logits_tolerance)
        report = summary = None
        if reporting:
            report = _report(args, engine, plan, stage_phases, total, groups) + check_lines
            iters = max(1, args.iters)
            summary = {"tp": engine.parallel.tensor_parallel_size, "pp": engine.parallel.pipeline_parallel_size,
                       "tokens": plan.num_tokens, "padded_tokens": plan.padded_tokens, "sp_engaged": plan.sharded,
                       "cudagraph_size": plan.graph_size, "total_ms": 1e3 * total / iters,
                       "phases_ms": [{k: 1e3 * v / iters for k, v in ph.items()} for ph in stage_phases],
                       "max_abs_diff": diff, "check_passed": (code == 0) if args.check else None}
        if dist.is_initialized():
            dist.barrier()
        return {"code": code, "report": report, "summary": summary}
    finally:
        msd.destroy()
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _check(engine, groups, device, ids, mtp_ids, out, recorded, DeepseekV4Model, TPContext,
           RoutingTrace, logits_tolerance):
    """Compare this run's logits with the tp=1, pp=1 model on the same weights, on this rank."""
    ref_model = DeepseekV4Model(engine.model, tp=TPContext(0, 1, groups.self_group),
                                moe_backend=engine.moe_backend, device=device)
    ids_d = ids.to(device)
    mtp_d = mtp_ids.to(device) if mtp_ids is not None else None
    import torch

    with torch.no_grad():
        free = RoutingTrace()
        ref_model(ids_d, sharded=False, mtp_input_ids=mtp_d, routing=free)
        ref = ref_model(ids_d, sharded=False, mtp_input_ids=mtp_d,
                        routing=RoutingTrace(replay=[t.to(device) for t in recorded]))
    T = ids.shape[0]
    diffs = [(out.logits - ref.logits).abs().max().item()]
    if mtp_ids is not None:
        diffs.append((out.mtp_logits - ref.mtp_logits).abs().max().item())
    diff = max(diffs)
    layers = engine.model.num_layers + engine.model.num_mtp_layers
    tol = logits_tolerance(layers, ref.logits)
    choices = sum(t.numel() for t in free.recorded)
    differ = sum(int((a[:T].sort(-1).values.cpu() != b.sort(-1).values.cpu()).sum())
                 for a, b in zip(recorded, free.recorded))
    ok = diff <= tol
    lines = [f"max_abs_diff={diff:.6g}",
             f"check: {'PASS' if ok else 'FAIL'} (tolerance {tol:.4g} vs tp=1, pp=1 on the same weights"
             f"{' incl. MTP logits' if mtp_ids is not None else ''}; MoE routing replayed from this run; "
             f"{differ}/{choices} expert choices differ from free tp=1 routing)"]
    return lines, 0 if ok else 1, diff


def _report(args, engine, plan, stage_phases, total, groups) -> list[str]:
    p = engine.parallel
    iters = max(1, args.iters)
    rows = -(-plan.padded_tokens // p.tensor_parallel_size)
    sp = (f"yes (token-sharded: {rows} stream rows per rank)" if plan.sharded else
          "no" + ("" if engine.sp_min_tokens is not None else " (SP not configured)"))
    lines = [
        f"{PREFIX}: tp={p.tensor_parallel_size} pp={p.pipeline_parallel_size} device={args.device} "
        f"layers={engine.model.num_layers} hidden={engine.model.hidden_size} "
        f"heads={engine.model.num_heads} experts={engine.model.num_routed_experts} "
        f"top_k={engine.model.num_experts_per_tok} mtp={'yes' if args.mtp else 'no'}",
        f"tokens={plan.num_tokens} padded={plan.padded_tokens} sp_threshold={p.sp_threshold} "
        f"(in effect: {engine.sp_min_tokens}) cudagraph="
        f"{plan.graph_size if plan.graph_size is not None else 'off'}",
        f"SP engaged: {sp}",
        f"per-phase time, ms per forward (mean of {iters}; TP rank 0 of each stage):",
    ]
    for stage, phases in enumerate(stage_phases):
        parts = "  ".join(f"{k} {1e3 * v / iters:.3f}" for k, v in phases.items())
        lines.append(f"  stage {stage}: {parts}")
    lines.append(f"  total {1e3 * total / iters:.3f} (last stage, wall)")
    return lines
