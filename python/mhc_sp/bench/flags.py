# SPDX-License-Identifier: Apache-2.0
"""The flags of ``mhc-sp-bench``, defined once and spelled as serving engines spell them
(``-tp/--tensor-parallel-size``, ``--hidden-size``), with their value domains (the types of
:mod:`mhc_sp.engine.config.arg_types`, and the upper bounds :mod:`.checks` applies).

A subcommand adds the flags it needs with the ``add_*`` functions below; a flag that sweeps takes
a comma list (``-tp 2,4``, ``--tokens 1,16,256``). A value outside a flag's domain is an
argparse error: exit status 2 and one line on stderr that names the flag."""

from __future__ import annotations

import argparse

from ..engine.config.arg_types import int_in, int_list, non_negative_int, positive_int, word_list
from ..profiling import PROFILERS  # the kinds of ``mhc_sp.profiling.profiled``

#: One meaning and one default for every subcommand: untimed calls first, then timed samples.
WARMUP = 2
REPEATS = 24
#: The mHC stream count the kernels accept (``kMaxHcMult``).
HC_MULT_RANGE = (1, 8)
#: Default file of ``--profile torch`` (a Chrome trace) and ``--profile nvtx-record`` (JSON).
TRACE = "mhc_sp_trace.json"
#: The largest value of every numeric flag (of a list flag: of each value), far beyond any
#: sensible run, so that a mistyped digit is refused at once instead of running for hours,
#: exhausting memory or overflowing. Checked after parsing (:func:`.checks.check_bounds`) for every
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
