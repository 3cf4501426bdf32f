# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench show: print a recorded result (a --json file of any subcommand) as the run
printed it (its command line, table and verdict) and write its --csv or --plot, without
measuring anything again. The recorded results under bench/results/ and the plots in docs/ are
shown and drawn this way."""

from __future__ import annotations

import importlib

from . import flags, report


def load(text: str) -> dict:
    """argparse type: a readable --json file of an mhc-sp-bench subcommand."""
    import argparse
    import json

    try:
        with open(text) as f:
            doc = json.load(f)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {e.strerror}") from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a JSON file") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise argparse.ArgumentTypeError(f"{text} has no result rows")
    present = presenter(doc.get("kind"))
    if present is None:
        raise argparse.ArgumentTypeError(
            f"{text}: results of kind {doc.get('kind')!r} have no view"
        )
    try:
        report.format_table(doc["rows"], present(doc)[1])
    except (KeyError, TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(
            f"{text} lacks {e} (written by another version of mhc-sp-bench?)"
        ) from None
    return doc


def presenter(kind):
    """The ``present(doc)`` of the subcommand that wrote a document of ``kind``."""
    if not isinstance(kind, str) or not kind.isidentifier() or kind == "show":
        return None
    try:
        module = importlib.import_module(f"{__package__}.{kind}_cmd")
    except ImportError:
        return None
    return getattr(module, "present", None)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "show", help="print a recorded --json result; write its CSV or plot", description=__doc__
    )
    p.add_argument("result", type=load, metavar="FILE", help="a --json file of a subcommand")
    flags.add_outputs(p, profile=False)
    p.set_defaults(func=run)


def run(args) -> int:
    doc = args.result
    report.publish(doc, args, presenter(doc["kind"]))
    return 0
