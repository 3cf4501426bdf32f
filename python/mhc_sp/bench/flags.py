# SPDX-License-Identifier: Apache-2.0
"""Flags and value parsers that every ``mhc-sp-bench`` subcommand shares."""

from __future__ import annotations

import argparse

import torch

from ..profiling import PROFILERS


def int_list(text: str) -> list[int]:
    """``"1,16,256"`` -> ``[1, 16, 256]`` (non-negative integers)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def add_common_args(p: argparse.ArgumentParser) -> None:
    """Device, threads, warm-up and repeats, output files and profiler hooks."""
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", help="write results as JSON")
    p.add_argument("--csv", help="write results as CSV")
    p.add_argument("--plot", help="write a PNG plot (needs matplotlib)")
    p.add_argument(
        "--profile",
        choices=PROFILERS,
        help="nsys: cudaProfilerStart/Stop around the measured region (run under "
        "nsys profile --capture-range=cudaProfilerApi); torch: a torch.profiler "
        "trace; nvtx-record: a JSON summary per NVTX range (count, total, mean time), "
        "recorded without nsys",
    )
    p.add_argument(
        "--trace",
        default="mhc_sp_trace.json",
        help="--profile torch output (Chrome trace), --profile nvtx-record output (JSON)",
    )
