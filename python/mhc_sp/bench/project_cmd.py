# SPDX-License-Identifier: Apache-2.0
"""``mhc-sp-bench project``: an analytical cost model of one sublayer boundary, to size
``sp_threshold``.

Per boundary with T tokens, hidden H, n streams, tp ranks (ring collectives, bf16 on the wire):

* replicated TP: all-reduce of the (T, H) partial, then post+pre over all T rows;
* SP, separate ops: reduce-scatter, post, pre, all-gather over T/tp rows (the stream is read and
  written twice, four launches);
* SP, fused (``fused_layer``): reduce-scatter, one post+pre pass over T/tp rows, all-gather.

Collective time = steps x latency + bus bytes / link bandwidth (all-reduce: 2(tp-1) steps and
2(tp-1)/tp x bytes; reduce-scatter / all-gather: tp-1 steps and (tp-1)/tp x bytes); mHC time =
bytes moved / memory bandwidth + launches x launch overhead. The crossover is the smallest token
count at which fused SP beats replicated TP: the recommended ``--sp-threshold``, raised above
``--max-cudagraph-capture-size`` when it is not already (SP never engages on a captured size).
``--calibrate layer.json`` fits latency, link bandwidth, memory bandwidth and launch overhead to
measured ``mhc-sp-bench layer --json`` results. For the machine you are on, ``mhc-sp-bench tune``
measures the same answer instead of modelling it."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import torch

from ..config import EngineArgs
from . import report
from .flags import int_list


@dataclass(frozen=True)
class Machine:
    """Defaults: H200 (HBM3e, 4.8 TB/s) with NVLink-4 (450 GB/s per direction per GPU)."""

    link_gbps: float = 450.0
    link_latency_us: float = 2.5
    hbm_gbps: float = 4800.0
    launch_us: float = 4.0


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


def calibrate(rows: list[dict], n: int = 4) -> Machine:
    """Least-squares fit of the four constants to `layer` results (rows with tp, tokens, hidden and
    *_us times for fused_sharded / fused_replicated / separate_sharded)."""
    import numpy as np

    names = {
        "fused_sharded_us": "sp_fused",
        "fused_replicated_us": "replicated",
        "separate_sharded_us": "sp_separate",
    }
    A, b = [], []
    for r in rows:
        for col, path in names.items():
            if col in r and r["tp"] > 1:
                t = path_terms(path, r["tokens"], r["hidden"], n, r["tp"])
                A.append([t["steps"], t["bus_bytes"], t["mem_bytes"], t["launches"]])
                b.append(r[col] * 1e-6)
    if len(b) < 4:
        raise ValueError("calibrate: need layer results with tp > 1 for at least 2 token counts")
    A, b = np.asarray(A, dtype=float), np.asarray(b, dtype=float)
    scale = np.abs(A).max(0)
    scale[scale == 0] = 1
    coef, *_ = np.linalg.lstsq(A / scale, b, rcond=None)
    coef = np.maximum(coef / scale, 1e-15)  # physical constants are positive
    return Machine(
        link_gbps=1 / coef[1] / 1e9,
        link_latency_us=coef[0] * 1e6,
        hbm_gbps=1 / coef[2] / 1e9,
        launch_us=coef[3] * 1e6,
    )


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "project",
        help="analytical boundary cost model and sp_threshold crossover",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = Machine()
    p.add_argument("--tp", type=int_list, default=[2, 4, 8])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--hc-mult", type=int, default=4)
    p.add_argument(
        "--tokens", type=int_list, default=[1, 16, 128, 512, 1024, 2048, 4096, 8192, 16384]
    )
    p.add_argument("--link-gbps", type=float, default=d.link_gbps, help="per-direction link GB/s")
    p.add_argument("--link-latency-us", type=float, default=d.link_latency_us, help="per ring step")
    p.add_argument("--hbm-gbps", type=float, default=d.hbm_gbps)
    p.add_argument("--launch-us", type=float, default=d.launch_us)
    p.add_argument(
        "--calibrate", metavar="LAYER_JSON", help="fit the constants to `layer --json` output"
    )
    EngineArgs.add_cli_args(p, only=("max_cudagraph_capture_size",))
    p.add_argument("--json")
    p.add_argument("--csv")
    p.add_argument("--plot")
    p.set_defaults(func=run)


def run(args) -> int:
    m = Machine(args.link_gbps, args.link_latency_us, args.hbm_gbps, args.launch_us)
    for name in ("link_gbps", "link_latency_us", "hbm_gbps", "launch_us"):
        if getattr(m, name) <= 0 and not (name == "link_latency_us" and m.link_latency_us == 0):
            report.usage_error("project", f"--{name.replace('_', '-')} must be positive")
    if args.calibrate:
        with open(args.calibrate) as f:
            m = calibrate(json.load(f)["rows"], args.hc_mult)
    rows = []
    for tp in args.tp:
        x = crossover(args.hidden, args.hc_mult, tp, m)
        for T in args.tokens:
            t = {p: boundary_time(p, T, args.hidden, args.hc_mult, tp, m) for p in PATHS}
            rows.append(
                {
                    "tp": tp,
                    "tokens": T,
                    "hidden": args.hidden,
                    **{f"{p}_us": t[p] * 1e6 for p in PATHS},
                    "fused_speedup": t["replicated"] / t["sp_fused"],
                    "crossover_tokens": x,
                }
            )
    columns = [
        "tp",
        "tokens",
        "hidden",
        *(f"{p}_us" for p in PATHS),
        "fused_speedup",
        "crossover_tokens",
    ]

    def plot(ax, rows):
        for tp in args.tp:
            for p in PATHS:
                pts = [(r["tokens"], r[f"{p}_us"]) for r in rows if r["tp"] == tp]
                ax.plot(*zip(*pts), label=f"{p} tp={tp}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("predicted µs per boundary")
        ax.legend(fontsize=7)

    report.emit(
        "project",
        rows,
        columns,
        args,
        torch.device("cpu"),
        extra={"machine": asdict(m), "calibrated_from": args.calibrate},
        plot=plot,
    )
    where = (
        "calibrated machine"
        if args.calibrate
        else (f"{m.link_gbps:g} GB/s links, {m.hbm_gbps:g} GB/s memory")
    )
    for tp in args.tp:
        x = next(r["crossover_tokens"] for r in rows if r["tp"] == tp)
        n = recommend_threshold(args.hidden, args.hc_mult, tp, m, args.max_cudagraph_capture_size)
        prefix = "recommended" if len(args.tp) == 1 else f"recommended for -tp {tp}"
        if n is None:
            print(
                f"tp={tp} ({where}): the model never has fused SP beat replicated TP below "
                f"{1 << 22} tokens"
            )
            print(f"{prefix}: leave --sp-threshold unset (SP off)")
            continue
        print(
            f"tp={tp} ({where}): the model has fused SP beat replicated TP from {x} tokens"
            + (f"; CUDA graphs run up to {args.max_cudagraph_capture_size}" if n != x else "")
        )
        print(f"{prefix}: --sp-threshold {n}")
    return 0
