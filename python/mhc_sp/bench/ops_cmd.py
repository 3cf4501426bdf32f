"""``mhc-sp-bench ops``: every math op against the eager reference and torch.compile of it, with
achieved bandwidth as a share of the copy bandwidth measured in the same run."""

from __future__ import annotations

import argparse

import torch

from .. import ops
from .. import reference as R
from ..config import MhcConfig
from . import report
from ..profiling import phase, profiled
from .timing import copy_call, time_calls

OPS = ("mhc_post", "mhc_pre", "mhc_post_pre", "mhc_pre_broadcast", "hc_head")


def bytes_moved(name: str, T: int, n: int, H: int) -> int:
    """Bytes an ideal kernel reads and writes (bf16 streams, fp32 projection weights)."""
    stream, hidden, M = 2 * T * n * H, 2 * T * H, n * (n + 2)
    fn = 4 * M * n * H
    return {
        "mhc_post": 2 * stream + hidden,
        "mhc_pre": stream + fn + hidden,
        "mhc_post_pre": 2 * stream + 2 * hidden + fn,
        "mhc_pre_broadcast": stream + 2 * hidden + 4 * M * H,
        "hc_head": stream + hidden + 4 * n * n * H,
    }[name]


def op_calls(name: str, i: dict, cfg: MhcConfig):
    """(mhc_sp call, reference callable with the same inputs)."""
    w = i["norm_weight"]
    if name == "mhc_post":
        return (lambda: ops.mhc_post(i["x"], i["residual"], i["post"], i["comb"]),
                lambda: R.mhc_post(i["x"], i["residual"], i["post"], i["comb"]))
    if name == "mhc_pre":
        return (lambda: ops.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], w, cfg),
                lambda: R.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], w, cfg))
    if name == "mhc_post_pre":
        args = (i["x"], i["residual"], i["post"], i["comb"], i["fn"], i["scale"], i["base"], w)
        return (lambda: ops.mhc_post_pre(*args, cfg=cfg),
                lambda: R.mhc_post_pre(*args, cfg=cfg))
    if name == "mhc_pre_broadcast":
        return (lambda: ops.mhc_pre_broadcast(i["x"], i["fn"], i["scale"], i["base"], w, cfg),
                lambda: R.mhc_pre_broadcast(i["x"], i["fn"], i["scale"], i["base"], w, cfg))
    if name == "hc_head":
        return (lambda: ops.hc_head(i["residual"], i["head_fn"], i["head_scale"], i["head_base"], cfg),
                lambda: R.hc_head(i["residual"], i["head_fn"], i["head_scale"], i["head_base"],
                                  cfg.rms_eps, cfg.hc_eps))
    raise KeyError(name)


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def register(subparsers) -> None:
    p = subparsers.add_parser("ops", help="math ops vs eager and compiled reference, GB/s vs copy",
                              description=__doc__)
    p.add_argument("--tokens", type=int_list, default=[1, 16, 256, 4096])
    p.add_argument("--hidden", type=int_list, default=[4096])
    p.add_argument("--hc-mult", type=int, default=4)
    p.add_argument("--ops", default=",".join(OPS), help=f"subset of {','.join(OPS)}")
    p.add_argument("--compare", default="eager,compile",
                   help="baselines: eager reference, torch.compile of it (comma list, or 'none')")
    p.add_argument("--gemm", action="store_true",
                   help="also time one fp32 X @ fn^T (torch.matmul), the bound mhc_pre is held to")
    add_common_args(p)
    p.set_defaults(func=run)


def add_common_args(p) -> None:
    """Flags every subcommand shares."""
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", help="write results as JSON")
    p.add_argument("--csv", help="write results as CSV")
    p.add_argument("--plot", help="write a PNG plot (needs matplotlib)")
    p.add_argument("--profile", choices=("nsys", "torch"),
                   help="nsys: cudaProfilerStart/Stop around the measured region (run under "
                        "nsys profile --capture-range=cudaProfilerApi); torch: a torch.profiler trace")
    p.add_argument("--trace", default="mhc_sp_trace.json", help="--profile torch output (Chrome trace)")


def run(args) -> int:
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(names) - set(OPS))
    if unknown:
        report.usage_error("ops", f"--ops: unknown op(s) {unknown}; choose from {OPS}")
    baselines = [] if args.compare == "none" else args.compare.split(",")
    if set(baselines) - {"eager", "compile"}:
        report.usage_error("ops", f"--compare: expected eager,compile or none, got {args.compare!r}")
    cfg = MhcConfig(hc_mult=args.hc_mult)
    with profiled(args.profile, args.trace):
        rows = measure(args, names, baselines, cfg, device)
    columns = ["op", "tokens", "hidden", "median_us", "p10_us", "p90_us", "GB/s", "%copy"]
    columns += [c for c in ("x_gemm", "x_separate", "x_eager", "x_compile") if any(c in r for r in rows)]

    def plot(ax, rows):
        for name in names:
            pts = [(r["tokens"], r["GB/s"]) for r in rows if r["op"] == name]
            ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("GB/s")
        ax.legend()

    report.emit("ops", rows, columns, args, device, plot=plot)
    return 0


def measure(args, names, baselines, cfg, device) -> list[dict]:
    """One row per (hidden, tokens, op). An op and its baselines are timed interleaved."""
    rows = []
    shapes = [(H, T) for H in args.hidden for T in args.tokens]
    for H, T in report.progress(shapes, "ops"):
        i = R.random_inputs(T, args.hc_mult, H, seed=0, device=device)
        small = T <= 16 and device.type == "cuda"
        X = i["residual"].float().reshape(T, args.hc_mult * H)
        for name in names:
            fused, reference = op_calls(name, i, cfg)
            nbytes = bytes_moved(name, T, args.hc_mult, H)
            fns = {"op": fused, "copy": copy_call(nbytes, device)}
            if name == "mhc_post_pre":  # the same work as two ops
                post_args = (i["x"], i["residual"], i["post"], i["comb"])
                fns["separate"] = lambda: ops.mhc_pre(ops.mhc_post(*post_args), i["fn"], i["scale"],
                                                      i["base"], i["norm_weight"], cfg)
            if args.gemm:
                fns["gemm"] = lambda: torch.matmul(X, i["fn"].t())
            if "eager" in baselines:
                fns["eager"] = reference
            if "compile" in baselines:
                torch._dynamo.reset()
                fns["compile"] = torch.compile(reference, dynamic=False)
            with phase(f"{name} T={T} H={H}"):
                t = time_calls(fns, device, args.warmup, args.repeats, cuda_graph=small)
            op, copy = t["op"], t["copy"]
            row = {"op": name, "tokens": T, "hidden": H, "median_us": op.median * 1e6,
                   "p10_us": op.p10 * 1e6, "p90_us": op.p90 * 1e6, "GB/s": nbytes / op.median / 1e9,
                   "copy_GB/s": nbytes / copy.median / 1e9, "%copy": 100 * copy.median / op.median}
            if "gemm" in t:
                row["x_gemm"] = op.median / t["gemm"].median
            for base in ("separate", "eager", "compile"):
                if base in t:
                    row[f"x_{base}"] = t[base].median / op.median
            rows.append(row)
    return rows
