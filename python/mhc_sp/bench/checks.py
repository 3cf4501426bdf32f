# SPDX-License-Identifier: Apache-2.0
"""The checks every ``mhc-sp-bench`` subcommand gets before anything is measured: each numeric
flag's upper bound, the device this machine can run, the profiler, the output files, memory. A
problem is a usage error: one line on stderr naming the flag, exit status 2."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Optional

from . import machine
from .flags import UPPER
from .report import command_line


def usage_error(prog: str, message: str):
    """A bad flag found after parsing: one line, exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_bounds(args, prog: str) -> None:
    """Refuse a value above its flag's :data:`UPPER` bound (one line naming the flag)."""
    for flag, most in UPPER.items():
        value = getattr(args, flag[2:].replace("-", "_"), None)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > most:
                usage_error(prog, f"{flag} {v}: at most {most} (a mistyped value?)")


def ranks_of(args) -> int:
    """How many ranks a command starts, one GPU each on CUDA: -tp (its largest value where it
    sweeps) times -pp; 1 for a command without them."""
    tp = getattr(args, "tensor_parallel_size", 1)
    return (max(tp) if isinstance(tp, list) else tp) * getattr(args, "pipeline_parallel_size", 1)


def resolve_device(args, prog: str) -> None:
    """Fill in ``--device`` with what this machine can run: GPU ranks where it has a GPU for
    every rank, else CPU ranks (shared memory between them); ``args.device_note`` then says in
    one line why and what to run on a GPU node (printed once every check has passed). ``cuda``
    given on a machine without a GPU is refused."""
    if not hasattr(args, "device"):
        return
    gpus, ranks = machine.gpu_count(), ranks_of(args)
    if args.device is None:
        args.device = "cuda" if gpus and gpus >= ranks else "cpu"
        if args.device == "cpu" and ranks > 1:
            have = f"has {gpus} GPU{'s' if gpus > 1 else ''}" if gpus else "has no GPU"
            gpu_run = command_line([*getattr(args, "argv", [args.command]), "--device", "cuda"])
            args.device_note = (
                f"{prog}: {ranks} ranks on CPU cores (shared memory), since this machine {have} "
                f"and GPU ranks need one GPU each; on a node with {ranks} GPUs run: {gpu_run}"
            )
    if args.device == "cuda" and not gpus:
        usage_error(prog, "--device cuda: this machine has no usable CUDA device")


def profiler_problem(kind: Optional[str], device: str) -> Optional[str]:
    """Why ``--profile kind`` cannot work here, or None."""
    if kind == "nsys":
        if device != "cuda":
            return "--profile nsys: needs --device cuda and a GPU (use --profile torch on CPU)"
        under_nsys = any(k.startswith("NSYS_") for k in os.environ) or "nsys" in os.environ.get(
            "LD_PRELOAD", ""
        )
        if not under_nsys and shutil.which("nsys") is None:
            return "--profile nsys: nsys is not installed (not on PATH)"
    if kind == "nvtx-record":
        from ..profiling import nvtx_recorder_library

        try:
            nvtx_recorder_library()
        except ValueError as e:
            return f"--{e}"
    return None


def output_problem(flag: str, path: str) -> Optional[str]:
    """Why ``path`` cannot be written, or None. Nothing is created."""
    if os.path.isdir(path):
        return f"{flag} {path}: is a directory"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{flag} {path}: folder {folder} does not exist"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{flag} {path}: file is not writable"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{flag} {path}: folder {folder} is not writable"
    return None


PLOT_FORMATS = (".png", ".svg", ".pdf")


def plot_problem(path: str) -> Optional[str]:
    if not path.lower().endswith(PLOT_FORMATS):
        return f"--plot {path}: expected a file name ending in {', '.join(PLOT_FORMATS)}"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot: needs matplotlib (pip install matplotlib)"
    return None


def check_common(args, prog: str) -> None:
    """The checks every subcommand gets before it measures: each flag's upper bound, the
    device, the profiler, and that every output file can be written."""
    check_bounds(args, prog)
    resolve_device(args, prog)
    problem = profiler_problem(getattr(args, "profile", None), getattr(args, "device", "cpu"))
    if problem:
        usage_error(prog, problem)
    outputs = [("--json", "json"), ("--csv", "csv"), ("--plot", "plot")]
    if getattr(args, "profile", None) in ("torch", "nvtx-record"):
        outputs.append(("--trace", "trace"))
    seen = {}
    for flag, dest in outputs:
        path = getattr(args, dest, None)
        if not path:
            continue
        problem = output_problem(flag, path) or (plot_problem(path) if dest == "plot" else None)
        if problem:
            usage_error(prog, problem)
        real = os.path.realpath(path)
        if real in seen:
            usage_error(prog, f"{flag} and {seen[real]} name the same file {path}")
        seen[real] = flag


def case_bytes(tokens: int, hidden: int, n: int) -> int:
    """About the most memory one boundary or op case of ``tokens`` x ``hidden`` holds at once on a
    rank: the stream as drawn (fp32) and stored (bf16), its output and an fp32 copy of it (the
    reference's), the hidden-sized tensors, the projection weights."""
    return 16 * tokens * n * hidden + 8 * tokens * hidden + 4 * n * (n + 2) * n * hidden


def check_memory(prog: str, need: int, flags_named: str) -> None:
    """Refuse a run whose cases cannot fit in this machine's memory, before it starts."""
    have = machine.available_memory()
    if have is not None and need > have:
        usage_error(
            prog,
            f"{flags_named}: these sizes need about {need / 2**30:.1f} GiB of memory, this "
            f"machine has {have / 2**30:.1f} GiB available",
        )
