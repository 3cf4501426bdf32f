# SPDX-License-Identifier: Apache-2.0
"""Output of every benchmark subcommand: a table on stdout, optional JSON / CSV / PNG plot, each
carrying the full command line so that a result can be reproduced."""

from __future__ import annotations

import csv
import json
import os
import platform
import shlex
import sys
from typing import NoReturn, Sequence

import torch


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that reproduces a run: ``argv`` (default: this process's arguments)."""
    argv = sys.argv[1:] if argv is None else argv
    return " ".join(shlex.quote(a) for a in ["mhc-sp-bench", *argv])


def environment(device: torch.device) -> dict:
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "device": str(device),
    }
    # Allocator and threading settings change CPU timings (README: "Large outputs and glibc").
    env.update(
        {
            k: os.environ[k]
            for k in ("GLIBC_TUNABLES", "LD_PRELOAD", "OMP_NUM_THREADS")
            if k in os.environ
        }
    )
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    import mhc_sp

    env["mhc_sp_build"] = mhc_sp.build_info()
    return env


def format_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [
        max(len(c), *(len(row[i]) for row in cells)) if cells else len(c)
        for i, c in enumerate(columns)
    ]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def document(
    kind: str,
    rows: list[dict],
    device: torch.device,
    extra: dict | None = None,
    argv: Sequence[str] | None = None,
) -> dict:
    """The JSON document of a run: kind, command line, environment, extra fields, rows."""
    return {
        "kind": kind,
        "command": command_line(argv),
        "environment": environment(device),
        **(extra or {}),
        "rows": rows,
    }


def write_json(doc: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, default=str)


def emit(
    kind: str,
    rows: list[dict],
    columns: Sequence[str],
    args,
    device: torch.device,
    extra: dict | None = None,
    plot=None,
) -> dict:
    """Print the table and write the files the user asked for. ``plot(ax, rows)`` draws the
    subcommand's figure when ``--plot`` is given. Returns the JSON document."""
    doc = document(kind, rows, device, extra, getattr(args, "argv", None))
    print(f"# {doc['command']}")
    print(format_table(rows, columns))
    if getattr(args, "json", None):
        write_json(doc, args.json)
    if getattr(args, "csv", None):
        with open(args.csv, "w", newline="") as f:
            f.write(f"# {doc['command']}\n")
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else list(columns))
            writer.writeheader()
            writer.writerows(rows)
    if getattr(args, "plot", None) and plot is not None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print(
                "--plot needs matplotlib (pip install matplotlib); no plot written", file=sys.stderr
            )
        else:
            fig, ax = plt.subplots(figsize=(8, 5))
            plot(ax, rows)
            ax.set_title(doc["command"], fontsize=7)
            fig.tight_layout()
            fig.savefig(args.plot, dpi=120)
    return doc


def usage_error(command: str, message: str) -> NoReturn:
    """A bad flag found after parsing: argparse's format and exit status 2, no traceback."""
    print(f"mhc-sp-bench {command}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def progress(items, label: str):
    """Yield ``items`` while drawing ``label i/n`` on stderr (only on a terminal)."""
    items = list(items)
    tty = sys.stderr.isatty()
    for k, item in enumerate(items, 1):
        if tty:
            print(
                f"\r{label} {k}/{len(items)} {item}".ljust(70), end="", file=sys.stderr, flush=True
            )
        yield item
    if tty and items:
        print(file=sys.stderr)
