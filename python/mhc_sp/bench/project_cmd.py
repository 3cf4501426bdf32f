# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench project: an analytical cost model of one sublayer boundary, to size
--sp-threshold for a GPU cluster this machine cannot measure.

Per boundary with T tokens, hidden H, n streams, tp ranks (ring collectives, bf16 on the wire):

* replicated TP: all-reduce of the (T, H) partial, then post+pre over all T rows;
* SP, separate ops: reduce-scatter, post, pre, all-gather over T/tp rows (the stream is read and
  written twice, four launches);
* SP, fused (``fused_layer``): reduce-scatter, one post+pre pass over T/tp rows, all-gather.

Collective time = steps x latency + bus bytes / link bandwidth (all-reduce: 2(tp-1) steps and
2(tp-1)/tp x bytes; reduce-scatter / all-gather: tp-1 steps and (tp-1)/tp x bytes); mHC time =
bytes moved / memory bandwidth + launches x launch overhead. The crossover is the smallest token
count at which fused SP beats replicated TP: the recommended --sp-threshold, raised above
--max-cudagraph-capture-size when it is not already (SP never engages on a captured size).

The constants default to one H200 GPU with NVLink 4 (the output names them). --calibrate FILE
fits them instead to the times of a tune --json or layer --json run (least squares on relative
error, every constant positive), reports how well the model fits, and refuses a fit that leaves
a constant undetermined. For the machine you are on, mhc-sp-bench tune measures the answer
instead of modelling it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from itertools import combinations

import torch

from ..engine.config import EngineArgs, arg_types
from . import checks, flags, report
from .report import fmt_number


@dataclass(frozen=True)
class Machine:
    """The model's constants; the defaults are one H200 SXM GPU (HBM3e, 4.8 TB/s) with NVLink 4
    (450 GB/s per direction per GPU)."""

    link_gbps: float = 450.0
    link_latency_us: float = 2.5
    hbm_gbps: float = 4800.0
    launch_us: float = 4.0
    name: str = "H200 SXM with NVLink 4"

    def describe(self) -> str:
        """The hardware by name with every constant."""
        return (
            f"{self.name}: link {fmt_number(self.link_gbps)} GB/s per direction and "
            f"{fmt_number(self.link_latency_us)} us per ring step, memory "
            f"{fmt_number(self.hbm_gbps)} GB/s, {fmt_number(self.launch_us)} us per kernel launch"
        )


#: The constants in the order of the model's terms: (field, flag, term it multiplies, argparse
#: type, help).
CONSTANTS = (
    ("link_latency_us", "--link-latency-us", "steps", "non_negative", "latency per ring step, us"),
    ("link_gbps", "--link-gbps", "bus_bytes", "positive", "link bandwidth per direction, GB/s"),
    ("hbm_gbps", "--hbm-gbps", "mem_bytes", "positive", "memory bandwidth, GB/s"),
    ("launch_us", "--launch-us", "launches", "non_negative", "time per kernel launch, us"),
)


def stream_pass_bytes(rows: int, H: int, n: int) -> float:
    """post+pre in one pass: read stream + x, write stream + layer_input, read fn (fp32)."""
    return 2 * (2 * rows * n * H + 2 * rows * H) + 4 * n * (n + 2) * n * H


def path_terms(path: str, T: int, H: int, n: int, tp: int) -> dict:
    """The quantities the model multiplies by its constants: latency steps, bus bytes, memory
    bytes, launches."""
    S = 2 * T * H  # bf16 partial / gathered layer_input
    if path == "replicated":
        steps, bus = 2 * (tp - 1), 2 * (tp - 1) / tp * S
        return {
            "steps": steps,
            "bus_bytes": bus,
            "mem_bytes": stream_pass_bytes(T, H, n),
            "launches": 2,
        }
    rows = -(-T // tp)
    steps, bus = 2 * (tp - 1), 2 * (tp - 1) / tp * S  # RS + AG
    if path == "sp_fused":
        return {
            "steps": steps,
            "bus_bytes": bus,
            "mem_bytes": stream_pass_bytes(rows, H, n),
            "launches": 3,
        }
    if path == "sp_separate":
        extra = 2 * 2 * rows * n * H  # the stream is written by post and read again by pre
        return {
            "steps": steps,
            "bus_bytes": bus,
            "mem_bytes": stream_pass_bytes(rows, H, n) + extra,
            "launches": 4,
        }
    raise KeyError(path)


PATHS = ("replicated", "sp_separate", "sp_fused")


def boundary_time(path: str, T: int, H: int, n: int, tp: int, m: Machine) -> float:
    """Seconds for one boundary on `path`."""
    t = path_terms(path, T, H, n, tp)
    if tp == 1:
        t = {**t, "steps": 0, "bus_bytes": 0.0}
    return (
        t["steps"] * m.link_latency_us * 1e-6
        + t["bus_bytes"] / (m.link_gbps * 1e9)
        + t["mem_bytes"] / (m.hbm_gbps * 1e9)
        + t["launches"] * m.launch_us * 1e-6
    )


def crossover(H: int, n: int, tp: int, m: Machine, max_tokens: int = 1 << 22) -> int | None:
    """Smallest token count (a multiple of tp) at which fused SP is faster than replicated TP."""
    if tp == 1:
        return None

    def slower(T):
        return boundary_time("sp_fused", T, H, n, tp, m) >= boundary_time(
            "replicated", T, H, n, tp, m
        )

    hi = tp
    while slower(hi):
        hi *= 2
        if hi > max_tokens:
            return None
    lo = hi // 2 if hi > tp else 0  # slower(lo) holds (or lo == 0)
    while hi - lo > tp:
        mid = (lo + hi) // 2 // tp * tp
        if mid <= lo:
            break
        if slower(mid):
            lo = mid
        else:
            hi = mid
    return hi


def recommend_threshold(H: int, n: int, tp: int, m: Machine, max_capture: int = 0) -> int | None:
    """The ``--sp-threshold`` the model recommends: its crossover, or ``max_capture + 1`` when
    that is larger; None when fused SP never wins."""
    x = crossover(H, n, tp, m)
    return None if x is None else max(x, max_capture + 1)


# ---- calibration ----------------------------------------------------------------------------


def measured_times(doc: dict) -> list[tuple[str, int, int, int, float]]:
    """(path, tokens, hidden size, tp, seconds) of every time in a ``tune --json`` or
    ``layer --json`` document; raises ValueError naming what is missing."""
    kind, rows = doc.get("kind"), doc.get("rows")
    if kind not in ("tune", "layer") or not isinstance(rows, list):
        raise ValueError(f"expected the --json file of tune or layer, got kind {kind!r}")
    times = []
    try:
        for r in rows:
            if kind == "tune":
                tp, H = doc["tensor_parallel_size"], doc["hidden_size"]
                pairs = (
                    ("sp_fused", r["sharded_ms"] * 1e-3),
                    ("replicated", r["replicated_ms"] * 1e-3),
                )
            else:
                tp, H = r["tensor_parallel_size"], r["hidden_size"]
                pairs = (
                    ("sp_fused", r["fused_sharded_us"] * 1e-6),
                    ("replicated", r["fused_replicated_us"] * 1e-6),
                    ("sp_separate", r["separate_sharded_us"] * 1e-6),
                )
            times += [(path, r["tokens"], H, tp, t) for path, t in pairs]
    except (KeyError, TypeError) as e:
        raise ValueError(f"a row lacks {e}") from None
    return times


@dataclass(frozen=True)
class Fit:
    machine: Machine
    median_error: float  # relative, over the measured times
    worst_error: float
    points: int

    def describe(self) -> str:
        return (
            f"fit: the model is off by {100 * self.median_error:.0f}% (median) and "
            f"{100 * self.worst_error:.0f}% (worst) over {self.points} measured times"
        )


def calibrate(doc: dict, n: int = 4, name: str = "fitted") -> Fit:
    """Fit the four constants to the measured times of ``doc`` by least squares on relative
    error with every constant positive (the best of the fits on every subset of the constants
    whose values all come out positive). Raises ValueError for a degenerate fit: too few
    distinct times, or one that leaves a constant at zero (the times do not determine it)."""
    import numpy as np

    times = measured_times(doc)
    if len({(t[1], t[3]) for t in times}) < 2 or len(times) < 4:
        raise ValueError("need times at 2 or more token counts (4 or more times) to fit")
    terms = [path_terms(path, T, H, n, tp) for path, T, H, tp, _ in times]
    A = np.array([[t[c[2]] for c in CONSTANTS] for t in terms], dtype=float)
    b = np.array([t[-1] for t in times], dtype=float)
    if not (b > 0).all():
        raise ValueError("every measured time must be positive")
    A, b = A / b[:, None], np.ones_like(b)  # relative error: every time counts alike
    scale = np.abs(A).max(0)
    scale[scale == 0] = 1
    best = None
    for k in range(len(CONSTANTS), 0, -1):
        for subset in combinations(range(len(CONSTANTS)), k):
            cols = list(subset)
            coef, *_ = np.linalg.lstsq(A[:, cols] / scale[cols], b, rcond=None)
            if (coef <= 0).any():
                continue
            full = np.zeros(len(CONSTANTS))
            full[cols] = coef / scale[cols]
            residual = float(np.sum((A @ full - b) ** 2))
            if best is None or residual < best[0] - 1e-12:
                best = (residual, full)
    if best is None:
        raise ValueError("no fit with positive constants exists for these times")
    coef = best[1]
    rank = np.linalg.matrix_rank(A / scale)
    zero = [const[1] for const, c in zip(CONSTANTS, coef) if c <= 0]
    # A constant whose term adds under 0.1% to every time is not measured by these times.
    share = (A * coef).max(0)
    faint = [const[1] for const, c, s in zip(CONSTANTS, coef, share) if c > 0 and s < 1e-3]
    if zero or faint or rank < len(CONSTANTS):
        missing = [const[1] for const in CONSTANTS if const[1] in zero + faint]
        what = ", ".join(missing) if missing else "the four constants"
        raise ValueError(
            f"degenerate fit: these times do not determine {what}; measure more token counts "
            f"(tune --tokens) or several tensor-parallel sizes (layer -tp 2,4)"
        )
    machine = Machine(
        link_latency_us=coef[0] * 1e6,
        link_gbps=1 / coef[1] / 1e9,
        hbm_gbps=1 / coef[2] / 1e9,
        launch_us=coef[3] * 1e6,
        name=name,
    )
    errors = np.abs(A @ coef - 1)
    return Fit(machine, float(np.median(errors)), float(errors.max()), len(times))


def readable_json(text: str) -> dict:
    """argparse type of --calibrate: a JSON file that can be read."""
    import argparse

    try:
        with open(text) as f:
            return {"path": text, "doc": json.load(f)}
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {e.strerror}") from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a JSON file") from None


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "project",
        help="analytical boundary cost model and sp_threshold crossover",
        description=__doc__,
    )
    d = Machine()
    flags.add_tensor_parallel_size(p, [2, 4, 8], sweep=True)
    flags.add_hidden_size(p, 4096, sweep=False)
    flags.add_hc_mult(p)
    flags.add_tokens(p, [1, 16, 128, 512, 1024, 2048, 4096, 8192, 16384])
    types = {"positive": arg_types.positive_float, "non_negative": arg_types.non_negative_float}
    for field, flag, _, kind, text in CONSTANTS:
        p.add_argument(flag, type=types[kind], default=getattr(d, field), metavar="X", help=text)
    p.add_argument(
        "--calibrate",
        type=readable_json,
        metavar="FILE",
        help="fit the four constants to the times of a tune --json or layer --json file instead",
    )
    EngineArgs.add_cli_args(p, only=("max_cudagraph_capture_size",))
    flags.add_outputs(p, profile=False)
    p.set_defaults(func=run, validate=check)


def check(args) -> None:
    """The machine to model: the defaults, the constants given, or the fit (refused when
    degenerate)."""
    d = Machine()
    given = {
        field: getattr(args, field)
        for field, *_ in CONSTANTS
        if getattr(args, field) != getattr(d, field)
    }
    args.fit = None
    if args.calibrate:
        if given:
            flag = "--" + next(iter(given)).replace("_", "-")
            checks.usage_error(args.prog, f"--calibrate: fits every constant; leave out {flag}")
        path, doc = args.calibrate["path"], args.calibrate["doc"]
        try:
            args.fit = calibrate(doc, args.hc_mult, name=f"fitted to {path}")
        except ValueError as e:
            checks.usage_error(args.prog, f"--calibrate {path}: {e}")
        args.machine = args.fit.machine
    elif given:
        changed = ", ".join(f"--{k.replace('_', '-')} {fmt_number(v)}" for k, v in given.items())
        args.machine = replace(d, name=f"{d.name}, changed by {changed}", **given)
    else:
        args.machine = d


def run(args) -> int:
    m, H, n = args.machine, args.hidden_size, args.hc_mult
    capture = args.max_cudagraph_capture_size
    rows, recommended = [], {}
    for tp in args.tensor_parallel_size:
        x = crossover(H, n, tp, m)
        recommended[tp] = recommend_threshold(H, n, tp, m, capture)
        for T in args.tokens:
            t = {p: boundary_time(p, T, H, n, tp, m) for p in PATHS}
            rows.append(
                {
                    "tensor_parallel_size": tp,
                    "tokens": T,
                    "hidden_size": H,
                    **{f"{p}_us": t[p] * 1e6 for p in PATHS},
                    "speedup_x": t["replicated"] / t["sp_fused"],
                    "crossover_tokens": x,
                }
            )
    extra = {
        "machine": asdict(m),
        "hc_mult": n,
        "max_cudagraph_capture_size": capture,
        "recommended_sp_threshold": {str(k): v for k, v in recommended.items()},
    }
    if args.fit:
        extra["fit"] = {
            "from": args.calibrate["path"],
            "median_error": args.fit.median_error,
            "worst_error": args.fit.worst_error,
            "points": args.fit.points,
        }
    doc = report.document("project", rows, torch.device("cpu"), extra=extra, argv=args.argv)
    report.publish(doc, args, present)
    return 0


def present(doc: dict) -> tuple:
    m = Machine(**doc["machine"])
    intro = [f"assumed hardware: {m.describe()}"]
    fit = doc.get("fit")
    if fit:
        fitted = Fit(m, fit["median_error"], fit["worst_error"], fit["points"])
        intro.append(fitted.describe())
        if fit["median_error"] > 0.25:
            intro.append("the model fits these times poorly: treat its crossover with care")
    lines = []
    capture = doc["max_cudagraph_capture_size"]
    recommended = doc["recommended_sp_threshold"]
    for tp, n in recommended.items():
        x = next(r["crossover_tokens"] for r in doc["rows"] if str(r["tensor_parallel_size"]) == tp)
        prefix = "recommended" if len(recommended) == 1 else f"recommended for -tp {tp}"
        if n is None:
            lines.append(
                f"tp={tp}: the model never has fused SP beat replicated TP below {1 << 22} tokens"
            )
            lines.append(f"{prefix}: leave --sp-threshold unset (SP off)")
            continue
        lines.append(
            f"tp={tp}: the model has fused SP beat replicated TP from {x} tokens"
            + (f"; CUDA graphs run up to {capture}" if n != x else "")
        )
        lines.append(f"{prefix}: --sp-threshold {n}")
    columns = [
        report.col("tensor_parallel_size", "tp"),
        "tokens",
        "hidden_size",
        *(f"{p}_us" for p in PATHS),
        "speedup_x",
        "crossover_tokens",
    ]
    return intro, columns, lines, plot


def plot(ax, doc: dict) -> None:
    rows = doc["rows"]
    for tp in dict.fromkeys(r["tensor_parallel_size"] for r in rows):
        mine = [r for r in rows if r["tensor_parallel_size"] == tp]
        for p in PATHS:
            ax.plot([r["tokens"] for r in mine], [r[f"{p}_us"] for r in mine], label=f"{p} tp={tp}")
        x = mine[0]["crossover_tokens"]
        report.mark_crossover(ax, x, f"SP from {x} (tp={tp})")
    report.log2_tokens_axis(ax, "tokens")
    ax.set_yscale("log")
    ax.set_ylabel("predicted us per boundary")
    ax.legend(fontsize=7)
