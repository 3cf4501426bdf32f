# SPDX-License-Identifier: Apache-2.0
"""The flags of ``mhc-sp-bench``, defined once and spelled as serving engines spell them
(``-tp/--tensor-parallel-size``, ``--hidden-size``), with their value domains and the checks that
run before anything is measured.

A subcommand adds the flags it needs with the ``add_*`` functions below; a flag that sweeps takes
a comma list (``-tp 2,4``, ``--tokens 1,16,256``). A value outside a flag's domain is an
argparse error: exit status 2 and one line on stderr that names the flag."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Callable, Optional, Sequence

from ..config.engine_args import non_negative_int, positive_int
from ..profiling import PROFILERS  # the kinds of ``mhc_sp.profiling.profiled``
from .report import command_line

#: One meaning and one default for every subcommand: untimed calls first, then timed samples.
WARMUP = 2
REPEATS = 24
#: The mHC stream count the kernels accept (``kMaxHcMult``).
HC_MULT_RANGE = (1, 8)
#: Default file of ``--profile torch`` (a Chrome trace) and ``--profile nvtx-record`` (JSON).
TRACE = "mhc_sp_trace.json"
#: The largest value of every numeric flag (of a list flag: of each value), far beyond any
#: sensible run, so that a mistyped digit is refused at once instead of running for hours,
#: exhausting memory or overflowing. Checked after parsing (:func:`check_bounds`) for every
#: subcommand that has the flag, the engine's flags included.
UPPER = {
    "--warmup": 10_000,
    "--repeats": 10_000,
    "--tokens": 1 << 20,
    "--requests": 1 << 20,
    "--hidden-size": 1 << 16,
    "--tensor-parallel-size": 64,
    "--pipeline-parallel-size": 64,
    "--threads": 1024,
    "--max-cudagraph-capture-size": 1 << 20,
    "--graph-max-tokens": 1 << 20,
    "--num-speculative-tokens": 64,
    "--num-layers": 1024,
    "--num-heads": 1 << 12,
    "--num-experts": 1 << 12,
    "--num-experts-per-tok": 1 << 12,
    "--moe-intermediate-size": 1 << 17,
    "--vocab-size": 1 << 21,
    "--seed": 2**63 - 1,
    "--timeout": 86_400,
    "--budget-s": 86_400,
    "--link-latency-us": 1_000_000,
    "--link-gbps": 1_000_000,
    "--hbm-gbps": 1_000_000,
    "--launch-us": 1_000_000,
}

__all__ = ["PROFILERS", "non_negative_int", "positive_int"]  # re-exported: defined once elsewhere


# ---- parsers and help -----------------------------------------------------------------------


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help pages as plain text: every flag shows its default, and the reStructuredText
    backticks of docstrings are dropped."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS)
        if shown and action.option_strings and "default:" not in text and "%(default" not in text:
            text += f" (default: {_render(action.default)})".replace("%", "%%")
        return text

    def format_help(self) -> str:
        return super().format_help().replace("`", "")


def _render(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``prog: error: message`` on stderr, exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


# ---- value types ----------------------------------------------------------------------------


def int_in(lo: int, hi: Optional[int] = None) -> Callable[[str], int]:
    """argparse type: an integer in [lo, hi] (no upper bound when ``hi`` is None)."""
    domain = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected an integer {domain}, got {text!r}")
        return value

    parse.__name__ = f"integer {domain}"
    return parse


def int_list(minimum: int = 1) -> Callable[[str], list[int]]:
    """argparse type: ``"1,16,256"`` -> ``[1, 16, 256]``, each >= ``minimum``, in the order
    given; a value given twice is refused (it would be measured twice, or its second mention
    silently ignored)."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            values = []
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated integers >= {minimum}, got {text!r}"
            )
        twice = [v for v in dict.fromkeys(values) if values.count(v) > 1]
        if twice:
            raise argparse.ArgumentTypeError(
                f"{', '.join(map(str, twice))} given more than once in {text!r}: give each "
                f"value once"
            )
        return values

    parse.__name__ = f"list of integers >= {minimum}"
    return parse


def float_above(lo: float, inclusive: bool) -> Callable[[str], float]:
    """argparse type: a finite number > ``lo`` (>= ``lo`` when ``inclusive``)."""
    domain = f"{'>=' if inclusive else '>'} {lo:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (value >= lo if inclusive else value > lo) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"expected a number {domain}, got {text!r}")
        return value

    parse.__name__ = f"number {domain}"
    return parse


positive_float = float_above(0, inclusive=False)
non_negative_float = float_above(0, inclusive=True)


def word_list(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """argparse type: a comma list of distinct words from ``choices``."""

    def parse(text: str) -> list[str]:
        words = [w.strip() for w in text.split(",") if w.strip()]
        bad = [w for w in words if w not in choices]
        if not words or bad or len(set(words)) != len(words):
            raise argparse.ArgumentTypeError(
                f"expected distinct values from {','.join(choices)}, got {text!r}"
            )
        return words

    parse.__name__ = "comma list"
    return parse


# ---- the shared flags -----------------------------------------------------------------------


def add_tensor_parallel_size(p, default, sweep: bool, minimum: int = 2) -> None:
    """``-tp/--tensor-parallel-size``: ranks (a comma list where the subcommand sweeps)."""
    p.add_argument(
        "--tensor-parallel-size",
        "-tp",
        dest="tensor_parallel_size",
        type=int_list(minimum) if sweep else int_in(minimum),
        default=default,
        metavar="N[,N...]" if sweep else "N",
        help="tensor-parallel ranks" + (" (comma list: each in turn)" if sweep else ""),
    )


def add_hidden_size(p, default, sweep: bool) -> None:
    """``--hidden-size``: the model's hidden size H."""
    p.add_argument(
        "--hidden-size",
        dest="hidden_size",
        type=int_list(1) if sweep else positive_int,
        default=default,
        metavar="H[,H...]" if sweep else "H",
        help="hidden size" + (" (comma list)" if sweep else ""),
    )


def add_tokens(p, default, sweep: bool = True, minimum: int = 1, help: str = "") -> None:
    """``--tokens``: token counts (a comma list where the subcommand sweeps)."""
    p.add_argument(
        "--tokens",
        type=int_list(minimum) if sweep else int_in(minimum),
        default=default,
        metavar="T[,T...]" if sweep else "T",
        help=help or ("token counts (comma list)" if sweep else "tokens"),
    )


def add_hc_mult(p) -> None:
    lo, hi = HC_MULT_RANGE
    p.add_argument(
        "--hc-mult", type=int_in(lo, hi), default=4, metavar="n", help="mHC streams per token"
    )


def add_device(p) -> None:
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="where to run (default: cuda when a GPU is present, else cpu)",
    )


def add_threads(p, help: str = "CPU threads (per rank where there are ranks)") -> None:
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"{help} (default: the cores shared out over the ranks)",
    )


def add_transport(p, sweep: bool) -> None:
    """``--transport``: how CPU or CUDA ranks exchange data."""
    from ..distributed import TRANSPORTS

    known = sorted({t for ts in TRANSPORTS.values() for t in ts})
    p.add_argument(
        "--transport",
        type=word_list(known) if sweep else None,
        choices=None if sweep else known,
        default=["auto"] if sweep else "auto",
        metavar="NAME[,NAME...]" if sweep else "NAME",
        help="how the ranks exchange data: cpu: auto (shm on one host), shm, gloo; cuda: auto "
        "(symm where every GPU maps every peer), symm, nccl"
        + ("; a comma list is timed interleaved in one run" if sweep else ""),
    )


def add_timing(p) -> None:
    """``--warmup`` and ``--repeats``: one meaning and one default everywhere."""
    p.add_argument(
        "--warmup",
        type=non_negative_int,
        default=WARMUP,
        metavar="N",
        help="untimed calls before the timed ones",
    )
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=REPEATS,
        metavar="N",
        help="timed samples of each measured case",
    )


def add_measuring(p, threads: bool = True) -> None:
    """The flags of every command that measures: where, with how many threads, how often, and
    where the results and the profile go."""
    add_device(p)
    if threads:
        add_threads(p)
    add_timing(p)
    add_outputs(p)


def add_outputs(p, csv: bool = True, plot: bool = True, profile: bool = True) -> None:
    """``--json``, ``--csv``, ``--plot`` and ``--profile``/``--trace``: files are checked to be
    writable before anything is measured."""
    p.add_argument("--json", metavar="FILE", help="write the results and the command as JSON")
    if csv:
        p.add_argument("--csv", metavar="FILE", help="write the result rows as CSV")
    if plot:
        p.add_argument(
            "--plot", metavar="FILE", help="write a plot (PNG, SVG or PDF; needs matplotlib)"
        )
    if profile:
        p.add_argument(
            "--profile",
            choices=PROFILERS,
            help="nsys: cudaProfilerStart/Stop around the measured region (run under nsys "
            "profile --capture-range=cudaProfilerApi); torch: a torch.profiler trace written "
            "to --trace; nvtx-record: a JSON summary per NVTX range (count, total, mean time) "
            "written to --trace, recorded without nsys",
        )
        p.add_argument(
            "--trace",
            metavar="FILE",
            default=TRACE,
            help="--profile torch output (Chrome trace), --profile nvtx-record output (JSON)",
        )


# ---- checks before any work -----------------------------------------------------------------


def usage_error(prog: str, message: str):
    """A bad flag found after parsing: one line, exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def gpu_count() -> int:
    """The CUDA devices this process can use (0 without CUDA): the one probe every device choice
    and check reads."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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
    gpus, ranks = gpu_count(), ranks_of(args)
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


def check_bounds(args, prog: str) -> None:
    """Refuse a value above its flag's :data:`UPPER` bound (one line naming the flag)."""
    for flag, most in UPPER.items():
        value = getattr(args, flag[2:].replace("-", "_"), None)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > most:
                usage_error(prog, f"{flag} {v}: at most {most} (a mistyped value?)")


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


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(ranks: int, threads: Optional[int]) -> int:
    """``--threads``, or this machine's cores shared out over ``ranks`` (at least one)."""
    return threads or max(1, available_cores() // ranks)


def warn_oversubscribed(prog: str, ranks: int, threads: int) -> None:
    """One line on stderr when ranks x threads exceed the cores: ranks then wait for each
    other's time slices, and the times measure the contention."""
    cores = available_cores()
    if ranks * threads > cores:
        print(
            f"{prog}: warning: {ranks} ranks x {threads} thread(s) = {ranks * threads} > "
            f"{cores} cores: the ranks take turns on the cores, so times include that wait",
            file=sys.stderr,
        )


def warn_busy(prog: str) -> None:
    """One line on stderr when other work already keeps this machine's cores busy: the times
    then include waiting for a core (a rank, or a thread of a parallel op, that is switched
    out holds up the others)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available here
        return
    cores = available_cores()
    if load > cores:
        print(
            f"{prog}: warning: this machine is busy (load average {load:.1f} on {cores} cores): "
            f"times include waiting for a core; compare runs made alike",
            file=sys.stderr,
        )


def case_bytes(tokens: int, hidden: int, n: int) -> int:
    """About the most memory one boundary or op case of ``tokens`` x ``hidden`` holds at once on a
    rank: the stream as drawn (fp32) and stored (bf16), its output and an fp32 copy of it (the
    reference's), the hidden-sized tensors, the projection weights."""
    return 16 * tokens * n * hidden + 8 * tokens * hidden + 4 * n * (n + 2) * n * hidden


def available_memory() -> Optional[int]:
    """Bytes of memory available to new work (Linux ``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(prog: str, need: int, flags_named: str) -> None:
    """Refuse a run whose cases cannot fit in this machine's memory, before it starts."""
    have = available_memory()
    if have is not None and need > have:
        usage_error(
            prog,
            f"{flags_named}: these sizes need about {need / 2**30:.1f} GiB of memory, this "
            f"machine has {have / 2**30:.1f} GiB available",
        )
