#!/usr/bin/env python3
"""Time the five mHC CUDA ops against the eager reference, torch.compile of the reference, and a
device-to-device copy moving the same number of bytes, all in one run on one GPU.

Each row reports medians (CUDA events) over several samples; for T <= --graph-max-tokens the op
is captured into a CUDA graph (several calls per graph) and replayed, so launch overhead does not
hide the kernel time, as an engine's decode step would run it. "bytes" is the op's minimal
global-memory traffic (streams read + written, fn, coefficients); the copy baseline copies
bytes / 2 (read + write = bytes), so "copy%" = copy time / op time is the fraction of a plain copy's
bandwidth the op reaches.

  python bench/gpu_bench_ops.py --json out.json            # full sweep
  python bench/gpu_bench_ops.py --tokens 1 16 --hidden 4096 --ops mhc_post_pre --no-compile
  python bench/gpu_bench_ops.py --list                     # print the cases, needs no GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

OPS = ["mhc_post", "mhc_pre", "mhc_post_pre", "mhc_pre_broadcast", "hc_head"]
DEFAULT_TOKENS = [1, 16, 256, 4096, 16384]
DEFAULT_HIDDEN = [4096, 7168]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=DEFAULT_TOKENS, help="token counts T")
    p.add_argument("--hidden", type=int, nargs="+", default=DEFAULT_HIDDEN, help="hidden sizes H")
    p.add_argument("--hc-mult", type=int, default=4, help="streams per token n")
    p.add_argument("--ops", nargs="+", choices=OPS, default=OPS)
    p.add_argument("--no-norm", action="store_true", help="pre ops without the fused RMSNorm")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--no-reference", action="store_true", help="skip the eager reference baseline")
    p.add_argument("--graph-max-tokens", type=int, default=256,
                   help="replay a CUDA graph for T up to this (default 256)")
    p.add_argument("--samples", type=int, default=5, help="timed samples per measurement (median)")
    p.add_argument("--target-ms", type=float, default=20.0, help="approximate time per sample")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="stop starting new cases after this many seconds (0: no limit)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true", help="print the cases and exit (no GPU needed)")
    args = p.parse_args(argv)
    for t in args.tokens:
        if t < 1:
            p.error(f"--tokens must be positive, got {t}")
    for h in args.hidden:
        if h < 1:
            p.error(f"--hidden must be positive, got {h}")
    if not 1 <= args.hc_mult <= 8:
        p.error(f"--hc-mult must be in [1, 8], got {args.hc_mult}")
    if args.samples < 1:
        p.error("--samples must be >= 1")
    return args


def cases(args):
    return [(op, h, t) for h in args.hidden for t in args.tokens for op in args.ops]


def op_bytes(op, T, n, H):
    """Minimal global-memory traffic of one call, in bytes."""
    M = n * (n + 2)
    stream, hidden, coef = T * n * H * 2, T * H * 2, T * (n + n * n) * 4
    fn = M * n * H * 4
    if op == "mhc_post":
        return hidden + 2 * stream + coef
    if op == "mhc_pre":
        return stream + fn + hidden + coef + H * 4
    if op == "mhc_post_pre":
        return hidden + 2 * stream + 2 * coef + fn + hidden + H * 4
    if op == "mhc_pre_broadcast":
        return hidden + stream + fn + coef + hidden + H * 4
    if op == "hc_head":
        return stream + n * n * H * 4 + hidden
    raise KeyError(op)


# ---- everything below needs torch + a GPU -----------------------------------------------------

def make_inputs(T, n, H, seed, device):
    """Same distributions as mhc_sp.reference.random_inputs, generated on the GPU (fast for big T)."""
    import torch

    from mhc_sp import reference as R

    g = torch.Generator(device=device).manual_seed(seed)
    M = n * (n + 2)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g, device=device) * std

    return {
        "residual": randn(T, n, H).to(torch.bfloat16),
        "x": randn(T, H).to(torch.bfloat16),
        "fn": randn(M, n * H, std=(n * H) ** -0.5),
        "scale": 0.5 + torch.rand(3, generator=g, device=device),
        "base": randn(M, std=0.5),
        "post": 2 * torch.sigmoid(randn(T, n)),
        "comb": R.sinkhorn(randn(T, n, n), 20, 1e-6),
        "head_fn": randn(n, n * H, std=(n * H) ** -0.5),
        "head_scale": 0.5 + torch.rand(1, generator=g, device=device),
        "head_base": randn(n, std=0.5),
        "norm_weight": (1 + randn(H, std=0.1)).to(torch.bfloat16),
    }


def op_callable(impl, op, i, norm, cfg):
    """A zero-argument callable running `op` of mhc_sp.ops / mhc_sp.reference on inputs i."""
    from mhc_sp import ops

    w = i["norm_weight"] if norm else None
    if op == "mhc_post":
        return lambda: impl.mhc_post(i["x"], i["residual"], i["post"], i["comb"])
    if op == "mhc_pre":
        return lambda: impl.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], w, cfg=cfg)
    if op == "mhc_post_pre":
        return lambda: impl.mhc_post_pre(i["x"], i["residual"], i["post"], i["comb"], i["fn"], i["scale"],
                                         i["base"], w, cfg=cfg)
    if op == "mhc_pre_broadcast":
        return lambda: impl.mhc_pre_broadcast(i["x"], i["fn"], i["scale"], i["base"], w, cfg=cfg)
    if op == "hc_head":
        if impl is ops:
            return lambda: ops.hc_head(i["residual"], i["head_fn"], i["head_scale"], i["head_base"], cfg=cfg)
        return lambda: impl.hc_head(i["residual"], i["head_fn"], i["head_scale"], i["head_base"],
                                    cfg.rms_eps, cfg.hc_eps)
    raise KeyError(op)


def compiled_reference(op, cfg):
    """torch.compile of the reference op, one per op (dynamic shapes: no recompile per size)."""
    import torch

    from mhc_sp import reference as R

    ref = {
        "mhc_post": R.mhc_post,
        "mhc_pre": lambda *a: R.mhc_pre(*a, cfg=cfg),
        "mhc_post_pre": lambda *a: R.mhc_post_pre(*a, cfg=cfg),
        "mhc_pre_broadcast": lambda *a: R.mhc_pre_broadcast(*a, cfg=cfg),
        "hc_head": lambda *a: R.hc_head(*a, cfg.rms_eps, cfg.hc_eps),
    }[op]
    return torch.compile(ref, dynamic=True)


def compiled_callable(fn, op, i, norm):
    w = i["norm_weight"] if norm else None
    args = {
        "mhc_post": (i["x"], i["residual"], i["post"], i["comb"]),
        "mhc_pre": (i["residual"], i["fn"], i["scale"], i["base"], w),
        "mhc_post_pre": (i["x"], i["residual"], i["post"], i["comb"], i["fn"], i["scale"], i["base"], w),
        "mhc_pre_broadcast": (i["x"], i["fn"], i["scale"], i["base"], w),
        "hc_head": (i["residual"], i["head_fn"], i["head_scale"], i["head_base"]),
    }[op]
    return lambda: fn(*args)


def time_eager(fn, samples, target_ms):
    """Median milliseconds per call, CUDA events around a loop of calls."""
    import torch

    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    iters = max(1, min(1000, int(target_ms / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(samples):
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def time_graph(fn, samples, target_ms, calls_per_graph=10):
    """Median milliseconds per call of `fn` captured `calls_per_graph` times into one CUDA graph."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (lazy init, autotuning) outside the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    ms = time_eager(graph.replay, samples, target_ms)
    del graph
    return ms / calls_per_graph


def measure(fn, use_graph, samples, target_ms):
    """(ms, mode): a graph replay when asked and capturable, else eager."""
    if use_graph:
        try:
            return time_graph(fn, samples, target_ms), "graph"
        except Exception as e:  # e.g. a compiled baseline that cannot be captured
            print(f"    (graph capture failed: {type(e).__name__}: {e}; timing eagerly)", file=sys.stderr)
    return time_eager(fn, samples, target_ms), "eager"


def run(args):
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_bench_ops.py needs a CUDA device (use --list to see the cases)")

    import mhc_sp
    from mhc_sp import ops
    from mhc_sp import reference as R
    from mhc_sp.config import MhcConfig
    cfg = MhcConfig(hc_mult=args.hc_mult)
    n, norm = args.hc_mult, not args.no_norm
    dev = torch.device("cuda")
    compiled = {} if args.no_compile else {op: compiled_reference(op, cfg) for op in args.ops}
    results = []
    t_start = time.monotonic()
    header = (f"{'op':<18}{'H':>6}{'T':>7}{'mode':>7}{'op us':>10}{'ref us':>10}{'comp us':>10}"
              f"{'copy us':>10}{'GB/s':>8}{'copy%':>7}{'x ref':>7}{'x comp':>7}")
    print(header)
    print("-" * len(header))
    current = None
    for op, H, T in cases(args):
        if args.budget_s and time.monotonic() - t_start > args.budget_s:
            print(f"budget of {args.budget_s:.0f}s reached; remaining cases skipped")
            break
        if current != (H, T):
            current, i = (H, T), None
            torch.cuda.empty_cache()
            i = make_inputs(T, n, H, args.seed, dev)
        use_graph = T <= args.graph_max_tokens
        row = dict(op=op, T=T, H=H, n=n, norm=norm, bytes=op_bytes(op, T, n, H))
        row["op_ms"], row["op_mode"] = measure(op_callable(ops, op, i, norm, cfg), use_graph, args.samples,
                                               args.target_ms)
        if not args.no_reference:
            row["ref_ms"], row["ref_mode"] = measure(op_callable(R, op, i, norm, cfg), use_graph,
                                                     args.samples, args.target_ms)
        if compiled:
            try:
                row["compiled_ms"], row["compiled_mode"] = measure(
                    compiled_callable(compiled[op], op, i, norm), use_graph, args.samples, args.target_ms)
            except Exception as e:
                row["compiled_error"] = f"{type(e).__name__}: {e}"
        # The copy baseline: read + write of bytes / 2, in the same run and with the same timing mode.
        half = max(1, row["bytes"] // 4) * 2
        src = torch.empty(half, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        row["copy_ms"], row["copy_mode"] = measure(lambda: dst.copy_(src), use_graph, args.samples,
                                                   args.target_ms)
        del src, dst
        row["op_gbps"] = row["bytes"] / (row["op_ms"] * 1e-3) / 1e9
        row["copy_fraction"] = row["copy_ms"] / row["op_ms"]
        results.append(row)

        def us(key):
            return f"{row[key] * 1e3:10.1f}" if key in row else f"{'-':>10}"

        def ratio(key):
            return f"{row[key] / row['op_ms']:7.2f}" if key in row else f"{'-':>7}"

        print(f"{op:<18}{H:>6}{T:>7}{row['op_mode']:>7}{us('op_ms')}{us('ref_ms')}{us('compiled_ms')}"
              f"{us('copy_ms')}{row['op_gbps']:8.0f}{100 * row['copy_fraction']:6.0f}%"
              f"{ratio('ref_ms')}{ratio('compiled_ms')}", flush=True)
    props = torch.cuda.get_device_properties(dev)
    summary = dict(device=props.name, sms=props.multi_processor_count, torch=torch.__version__,
                   build_info=mhc_sp.build_info(), args={k: (str(v) if isinstance(v, Path) else v)
                                                         for k, v in vars(args).items()},
                   results=results, seconds=time.monotonic() - t_start)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1, default=str))
        print(f"wrote {args.json}")
    return summary


def main(argv=None):
    args = parse_args(argv)
    if args.list:
        for op, H, T in cases(args):
            print(f"{op:<18} H={H:<6} T={T:<7} bytes={op_bytes(op, T, args.hc_mult, H)}")
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
