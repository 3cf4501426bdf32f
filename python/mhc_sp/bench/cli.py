# SPDX-License-Identifier: Apache-2.0
"""Entry point of ``mhc-sp-bench`` (``pyproject``: ``mhc-sp-bench = mhc_sp.bench.cli:main``).

Without a subcommand it runs a quick ``tune``: it measures from how many tokens sequence
parallelism pays off on this machine and recommends ``--sp-threshold``. Subcommands are
discovered, not listed: every module ``mhc_sp.bench.<name>_cmd`` that defines
``register(subparsers)`` adds its parser there and sets ``func`` (``func(args) -> int`` exit code)
with ``parser.set_defaults(func=...)``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType
from typing import Optional, Sequence

PROG = "mhc-sp-bench"


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


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every discovered subcommand registered."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Benchmarks and checks for mhc_sp. Without a command: a quick "
        "`tune` (tp=2, hidden 4096) that recommends --sp-threshold for "
        "this machine.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in subcommand_modules():
        module.register(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the chosen subcommand; returns its exit
    code (argparse usage errors exit with 2 on their own)."""
    args = parse_args(argv)
    if getattr(args, "profile", None) == "nvtx-record":
        # NVTX looks for its tool once, at its first call: attach the recorder before any op runs,
        # in this process and (through the environment) in every rank it spawns.
        from ..profiling import use_nvtx_recorder

        try:
            use_nvtx_recorder()
        except ValueError as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            return 2
    return int(args.func(args) or 0)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parsed arguments; no subcommand means the quick ``tune``."""
    from .tune_cmd import QUICK

    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        argv = ["tune", *QUICK]
        args = parser.parse_args(argv)
    args.argv = argv  # the command line the JSON records: the one that ran
    return args
