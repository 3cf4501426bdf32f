# SPDX-License-Identifier: Apache-2.0
"""``mhc-sp-bench ops``: every math op against the eager reference and torch.compile of it, with
achieved bandwidth as a share of the copy bandwidth measured in the same run.

Ops, arguments and bytes moved come from the registry ``mhc_sp.testing.OPS``. "GB/s" is the
bytes the op must read and write (every argument and output once) over its median time; "%copy"
compares it with an out-of-place copy of the same bytes, timed interleaved with the op. On CUDA,
token counts up to ``--graph-max-tokens`` are timed as CUDA-graph replays (launch overhead
excluded, as an engine's captured decode steps run); the ``graph`` column says which.
The compiled baseline is ``torch.compile`` of the reference specialised to each shape
(``dynamic=False``, compiled afresh per op and shape): the strongest form of that baseline.
"""

from __future__ import annotations

import functools
import time

import torch

from .. import ops
from ..config import MhcConfig
from ..profiling import phase, profiled
from ..testing import OPS, random_inputs
from . import report
from .flags import add_common_args, int_list
from .timing import copy_call, time_calls


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "ops", help="math ops vs eager and compiled reference, GB/s vs copy", description=__doc__
    )
    p.add_argument("--tokens", type=int_list, default=[1, 16, 256, 4096])
    p.add_argument("--hidden", type=int_list, default=[4096])
    p.add_argument("--hc-mult", type=int, default=4)
    p.add_argument("--ops", default=",".join(OPS), help=f"subset of {','.join(OPS)}")
    p.add_argument(
        "--no-norm", action="store_true", help="pre ops without the fused RMSNorm weight"
    )
    p.add_argument(
        "--compare",
        default="eager,compile",
        help="baselines: eager reference, torch.compile of it (comma list, or 'none')",
    )
    p.add_argument(
        "--gemm",
        action="store_true",
        help="also time one fp32 X @ fn^T (torch.matmul), the bound mhc_pre is held to",
    )
    p.add_argument(
        "--graph-max-tokens",
        type=int,
        default=256,
        help="CUDA: time token counts up to this as CUDA-graph replays",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="start no new shape after this many seconds (0: no limit; the first "
        "shape always runs)",
    )
    add_common_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        report.usage_error("ops", "--device cuda: no CUDA device is available")
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(names) - set(OPS))
    if unknown:
        report.usage_error("ops", f"--ops: unknown op(s) {unknown}; choose from {list(OPS)}")
    baselines = [] if args.compare == "none" else args.compare.split(",")
    if set(baselines) - {"eager", "compile"}:
        report.usage_error(
            "ops", f"--compare: expected eager,compile or none, got {args.compare!r}"
        )
    if not 1 <= args.hc_mult <= 8:
        report.usage_error("ops", f"--hc-mult: expected a value in [1, 8], got {args.hc_mult}")
    cfg = MhcConfig(hc_mult=args.hc_mult)
    with profiled(args.profile, args.trace):
        rows, skipped = measure(args, names, baselines, cfg, device)
    columns = ["op", "tokens", "hidden", "median_us", "p10_us", "p90_us", "GB/s", "%copy"]
    columns += [
        c
        for c in ("graph", "x_gemm", "x_separate", "x_eager", "x_compile")
        if any(c in r for r in rows)
    ]

    def plot(ax, rows):
        for name in names:
            pts = [(r["tokens"], r["GB/s"]) for r in rows if r["op"] == name]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("GB/s")
        ax.legend()

    extra = {"skipped_shapes": skipped} if skipped else None
    report.emit("ops", rows, columns, args, device, extra=extra, plot=plot)
    if skipped:
        print(
            f"--budget-s {args.budget_s:g} reached: shapes not measured (hidden, tokens): {skipped}"
        )
    return 0


def measure(args, names, baselines, cfg, device) -> tuple[list[dict], list]:
    """One row per (hidden, tokens, op); an op and its baselines are timed interleaved. Returns
    the rows and the (hidden, tokens) shapes left out by ``--budget-s``."""
    rows, skipped = [], []
    start = time.monotonic()
    shapes = [(H, T) for H in args.hidden for T in args.tokens]
    for k, (H, T) in enumerate(report.progress(shapes, "ops")):
        if k and args.budget_s and time.monotonic() - start > args.budget_s:
            skipped = shapes[k:]
            break
        i = random_inputs(T, args.hc_mult, H, seed=0, device=device)
        graph = device.type == "cuda" and T <= args.graph_max_tokens
        for name in names:
            info = OPS[name]
            sample = info.sample(i, norm=not args.no_norm, cfg=cfg)
            nbytes = info.bytes_moved(sample)
            fns = {
                "op": functools.partial(info.op, *sample.args, **sample.kwargs),
                "copy": copy_call(nbytes, device),
            }
            if name == "mhc_post_pre":  # the same work as two ops
                a = sample.args
                fns["separate"] = lambda a=a: ops.mhc_pre(ops.mhc_post(*a[:4]), *a[4:], cfg=cfg)
            if args.gemm:
                X = i["residual"].float().reshape(T, args.hc_mult * H)
                fns["gemm"] = functools.partial(torch.matmul, X, i["fn"].t())
            if "eager" in baselines:
                fns["eager"] = functools.partial(info.reference, *sample.args, **sample.kwargs)
            compile_error = None
            if "compile" in baselines:
                torch._dynamo.reset()  # a fresh cache: no recompile limit, no stale graphs
                compiled = torch.compile(info.reference, dynamic=False)
                fns["compile"] = functools.partial(compiled, *sample.args, **sample.kwargs)
                try:  # a baseline that fails to compile is reported, not fatal
                    fns["compile"]()
                except Exception as e:  # noqa: BLE001
                    compile_error = f"{type(e).__name__}: {e}"[:300]
                    del fns["compile"]
            with phase(f"{name} T={T} H={H}"):
                t = time_calls(fns, device, args.warmup, args.repeats, cuda_graph=graph)
            rows.append(row(name, T, H, nbytes, t, device))
            if compile_error:
                rows[-1]["compile_error"] = compile_error
        del i
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, skipped


def row(name: str, T: int, H: int, nbytes: int, t: dict, device: torch.device) -> dict:
    """One table row from the timings of an op (``t["op"]``), the copy and the baselines."""
    op, copy = t["op"], t["copy"]
    r = {
        "op": name,
        "tokens": T,
        "hidden": H,
        "bytes": nbytes,
        "median_us": op.median * 1e6,
        "p10_us": op.p10 * 1e6,
        "p90_us": op.p90 * 1e6,
        "GB/s": nbytes / op.median / 1e9,
        "copy_GB/s": nbytes / copy.median / 1e9,
        "%copy": 100 * copy.median / op.median,
    }
    if device.type == "cuda":
        r["graph"] = op.graph
    if "gemm" in t:
        r["x_gemm"] = op.median / t["gemm"].median
    for base in ("separate", "eager", "compile"):
        if base in t:
            r[f"x_{base}"] = t[base].median / op.median
            if device.type == "cuda":
                r[f"{base}_graph"] = t[base].graph
    return r
