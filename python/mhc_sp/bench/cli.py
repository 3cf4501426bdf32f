# SPDX-License-Identifier: Apache-2.0
"""Entry point of ``mhc-sp-bench`` (``pyproject``: ``mhc-sp-bench = mhc_sp.bench.cli:main``).

Without a subcommand it runs a quick ``tune``: it measures from how many tokens sequence
parallelism pays off on this machine and recommends ``--sp-threshold``; flags given without a
subcommand go to that quick tune (``mhc-sp-bench --json quick.json``). Subcommands are
discovered, not listed: every module ``mhc_sp.bench.<name>_cmd`` that defines
``register(subparsers)`` adds its parser there and sets, with ``parser.set_defaults``:

* ``func(args) -> int``: the command (its exit code);
* ``validate(args)`` (optional): cross-flag checks that run before any work;
* ``measures`` (optional): ``"ranks"`` when it measures in spawned ranks, ``"here"`` when in this
  process; such commands run with the allocator setting of :mod:`.allocator`.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import signal
import sys
import time
from types import ModuleType
from typing import Optional, Sequence

from ..local_world import Stopped, stop_on_signals
from . import allocator, checks, flags, machine
from .report import PROG

#: The quick tune of the bare command (flags the user gives replace these).
QUICK = ["--tokens", "4,16,64,256,1024"]


def subcommand_modules() -> list[ModuleType]:
    """The ``*_cmd`` modules of this package that define ``register``, sorted by name."""
    from . import __path__ as package_path

    modules = []
    for info in sorted(pkgutil.iter_modules(package_path), key=lambda i: i.name):
        if info.name.endswith("_cmd"):
            module = importlib.import_module(f"{__package__}.{info.name}")
            if callable(getattr(module, "register", None)):
                modules.append(module)
    return modules


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    import mhc_sp

    try:
        ours = installed("mhc_sp")
    except PackageNotFoundError:
        ours = "(not installed)"
    info = mhc_sp.build_info()
    built = ", ".join(f"{k} {v}" for k, v in info.items())
    return f"{PROG} {ours} ({built})"


def build_parser() -> flags.Parser:
    """The top-level parser with every discovered subcommand registered."""
    parser = flags.Parser(
        prog=PROG,
        allow_abbrev=False,
        description="Benchmarks and checks for mhc_sp. Without a command: a quick tune (-tp 2, "
        "hidden size 4096, 4 to 1024 tokens) that recommends --sp-threshold for this machine; "
        "flags given without a command go to it (see mhc-sp-bench tune -h).",
    )
    parser.add_argument("--version", action="version", version=version())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=flags.Parser)
    for module in subcommand_modules():
        module.register(subparsers)
    for sub in subparsers.choices.values():
        sub.allow_abbrev = False  # one spelling per flag: no abbreviations either
    return parser


def command_argv(argv: Sequence[str]) -> list[str]:
    """The arguments to parse: the bare command, or flags without a command, become the quick
    tune (the user's flags replace its defaults)."""
    argv = list(argv)
    if argv and (not argv[0].startswith("-") or argv[0] in ("-h", "--help", "--version")):
        return argv
    given = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
    quick = []
    for flag, value in zip(QUICK[::2], QUICK[1::2]):
        if flag not in given:
            quick += [flag, value]
    return ["tune", *quick, *argv]


def parse_args(argv: Optional[Sequence[str]] = None):
    """Parsed arguments (no work, no checks beyond argparse's); ``args.argv`` is the command
    line that ran, which the outputs record."""
    argv = command_argv(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    args.prog = f"{PROG} {args.command}"
    return args


def prepare(argv: Optional[Sequence[str]] = None):
    """Parse and check everything that can be checked before measuring: flag domains, devices,
    profilers, output files, each subcommand's own rules. A problem exits with status 2 and
    one line on stderr."""
    args = parse_args(argv)
    checks.check_common(args, args.prog)
    validate = getattr(args, "validate", None)
    if validate is not None:
        validate(args)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``mhc-sp-bench`` with ``argv`` (default: this process's arguments); returns the exit
    code (usage errors exit with 2 on their own)."""
    environment = dict(os.environ)
    try:
        with stop_on_signals():
            return _run(argv)
    except (KeyboardInterrupt, Stopped) as e:
        name = "SIGINT" if isinstance(e, KeyboardInterrupt) else signal.Signals(e.signum).name
        fresh_line = "\n" if sys.stderr.isatty() else ""  # after a progress line redrawn in place
        print(
            f"{fresh_line}{PROG}: stopped by {name}; every rank it started has exited",
            file=sys.stderr,
        )
        return 128 + (signal.SIGINT if isinstance(e, KeyboardInterrupt) else e.signum)
    finally:
        if argv is not None:  # called from Python: leave the environment as it was
            os.environ.clear()
            os.environ.update(environment)


def _run(argv: Optional[Sequence[str]]) -> int:
    """:func:`main` without its handling of stop signals and of the environment."""
    try:
        args = prepare(argv)
        if getattr(args, "device_note", None) and os.environ.get("RANK", "0") == "0":
            print(args.device_note, file=sys.stderr, flush=True)  # once in a launched world
        measures = getattr(args, "measures", None)
        if measures:
            line = allocator.apply(measures == "here", from_command_line=argv is None)
            print(f"{PROG}: {line}", file=sys.stderr, flush=True)
            machine.warn_busy(args.prog)
        prepare_profiler(args)
        started = time.time()
        code = int(args.func(args) or 0)
        if code == 0:
            report_profile(args, started)
        return code
    except (MemoryError, RuntimeError) as e:
        if not isinstance(e, MemoryError) and "can't allocate memory" not in str(e):
            raise
        print(f"{PROG}: out of memory: measure fewer or smaller cases", file=sys.stderr)
        return 1


def prepare_profiler(args) -> None:
    """What the profiler of ``--profile`` needs before any op runs, in this process and (through
    the environment) in every rank it spawns."""
    kind = getattr(args, "profile", None)
    if kind:
        # The profiler library's own chatter (e.g. that it found no GPU) is not for users.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    if kind == "nvtx-record":
        # NVTX looks for its tool once, at its first call: attach the recorder before any op runs.
        from ..profiling import use_nvtx_recorder

        try:
            use_nvtx_recorder()
        except ValueError as e:
            checks.usage_error(args.prog, f"--{e}")


def report_profile(args, started: float) -> None:
    """Say where the profile of this run went."""
    kind = getattr(args, "profile", None)
    if not kind:
        return
    trace = getattr(args, "trace", None)
    if trace and os.path.exists(trace) and os.path.getmtime(trace) >= started - 1:
        print(f"{PROG}: profile {kind}: trace written to {trace}", file=sys.stderr)
    elif kind == "nsys":
        print(
            f"{PROG}: profile nsys: the measured region was bracketed with "
            f"cudaProfilerStart/Stop; nsys writes the report it was told to (-o)",
            file=sys.stderr,
        )
    else:
        print(f"{PROG}: profile {kind}: no trace file was written", file=sys.stderr)
