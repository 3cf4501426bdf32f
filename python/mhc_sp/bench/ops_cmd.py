# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench ops: every math op against the eager reference and torch.compile of it, with
achieved bandwidth as a share of the copy bandwidth measured in the same run.

Ops, arguments and bytes moved come from the registry mhc_sp.testing.OPS. GB/s is the bytes the
op must read and write (every argument and output once) over its median time; %copy compares it
with an out-of-place copy of the same bytes, timed interleaved with the op. x_<baseline> is the
baseline's median time over the op's (x_gemm: the op's over one fp32 GEMM's). On CUDA, token
counts up to --graph-max-tokens are timed as CUDA-graph replays (launch overhead excluded, as an
engine's captured decode steps run); the graph column says which. The compiled baseline is
torch.compile of the reference specialised to each shape (dynamic=False, compiled afresh per op
and shape): the strongest form of that baseline.
"""

from __future__ import annotations

import functools
import time

import torch

from .. import ops
from ..config import MhcConfig
from ..engine.config import arg_types
from ..profiling import phase, profiled
from ..testing import OPS, random_inputs
from . import checks, flags, report
from .timing import copy_call, time_calls

COMPARE = ("eager", "compile")


def compare_list(text: str) -> list[str]:
    """argparse type of --compare: a comma list of baselines, or none."""
    return [] if text.strip() == "none" else arg_types.word_list(COMPARE)(text)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "ops", help="math ops vs eager and compiled reference, GB/s vs copy", description=__doc__
    )
    flags.add_tokens(p, [1, 16, 256, 4096], minimum=0)
    flags.add_hidden_size(p, [4096], sweep=True)
    flags.add_hc_mult(p)
    p.add_argument(
        "--ops",
        type=arg_types.word_list(tuple(OPS)),
        default=list(OPS),
        metavar="OP[,OP...]",
        help=f"ops to time, from {','.join(OPS)}",
    )
    p.add_argument(
        "--no-norm", action="store_true", help="pre ops without the fused RMSNorm weight"
    )
    p.add_argument(
        "--compare",
        type=compare_list,
        default=list(COMPARE),
        metavar="BASELINES",
        help="baselines timed beside each op: eager (the reference), compile (torch.compile "
        "of it); a comma list, or none",
    )
    p.add_argument(
        "--gemm",
        action="store_true",
        help="also time one fp32 X @ fn^T (torch.matmul), the bound mhc_pre is held to",
    )
    p.add_argument(
        "--graph-max-tokens",
        type=arg_types.non_negative_int,
        default=256,
        metavar="T",
        help="CUDA: time token counts up to this as CUDA-graph replays",
    )
    p.add_argument(
        "--budget-s",
        type=arg_types.non_negative_float,
        default=0.0,
        metavar="S",
        help="start no new shape after this many seconds (0: no limit; the first shape always "
        "runs)",
    )
    flags.add_measuring(p)
    p.set_defaults(func=run, validate=check, measures="here")


def check(args) -> None:
    if args.device == "cpu":  # one shape at a time, its op and baselines side by side
        need = max(
            2 * checks.case_bytes(T, H, args.hc_mult) for H in args.hidden_size for T in args.tokens
        )
        checks.check_memory(args.prog, need, "--tokens, --hidden-size")


def run(args) -> int:
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = MhcConfig(hc_mult=args.hc_mult)
    with profiled(args.profile, args.trace):
        rows, skipped = measure(args, args.ops, args.compare, cfg, device)
    extra = {"warmup": args.warmup, "repeats": args.repeats}
    if skipped:
        extra["skipped_shapes"] = skipped
    doc = report.document("ops", rows, device, extra=extra, argv=args.argv)
    report.publish(doc, args, present)
    return 0


def present(doc: dict) -> tuple:
    rows = doc["rows"]
    columns = [
        "op",
        "tokens",
        "hidden_size",
        report.interval_col("median_us [p10-p90]", "median_us", "p10_us", "p90_us"),
        "GB/s",
        "%copy",
    ]
    present_keys = dict.fromkeys(k for r in rows for k in r)
    columns += [
        c for c in ("graph", "x_gemm", "x_separate", "x_eager", "x_compile") if c in present_keys
    ]
    lines = []
    if doc.get("skipped_shapes"):
        lines.append(
            f"budget reached: shapes not measured (hidden_size, tokens): {doc['skipped_shapes']}"
        )
    return [], columns, lines, plot


def plot(ax, doc: dict) -> None:
    rows = doc["rows"]
    for name in dict.fromkeys(r["op"] for r in rows):
        for H in dict.fromkeys(r["hidden_size"] for r in rows):
            pts = [
                (r["tokens"], r["GB/s"]) for r in rows if (r["op"], r["hidden_size"]) == (name, H)
            ]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{name} H={H}")
    if rows:
        copy = max(r["copy_GB/s"] for r in rows)
        ax.axhline(copy, linestyle=":", color="0.4", linewidth=1)
        ax.annotate("fastest copy", xy=(0, copy), xycoords=("axes fraction", "data"), fontsize=7)
    ax.set_xscale("symlog", base=2)
    ax.set_xlabel("tokens")
    ax.set_ylabel("GB/s (bytes moved / median time)")
    ax.legend(fontsize=7)


def measure(args, names, baselines, cfg, device) -> tuple[list[dict], list]:
    """One row per (hidden, tokens, op); an op and its baselines are timed interleaved. Returns
    the rows and the (hidden, tokens) shapes left out by ``--budget-s``."""
    rows, skipped = [], []
    start = time.monotonic()
    shapes = [(H, T) for H in args.hidden_size for T in args.tokens]
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
        "hidden_size": H,
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
