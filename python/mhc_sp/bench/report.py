# SPDX-License-Identifier: Apache-2.0
"""Output of every benchmark subcommand: the command line, a table on stdout, optional JSON / CSV
/ plot files (each carrying the command line, so that a result can be reproduced), and progress
on stderr.

Numbers are formatted one way everywhere, chosen by the unit at the end of a column's name:
times (``_us``, ``_ms``) and bandwidths with three significant digits, ratios (``_x`` or
``x_``) with two decimals."""

from __future__ import annotations

import csv
import json
import os
import platform
import shlex
import sys
import time
from typing import Callable, Optional, Sequence, Union

import torch

PROG = "mhc-sp-bench"


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that reproduces a run: ``argv`` (default: this process's arguments)."""
    argv = sys.argv[1:] if argv is None else argv
    return " ".join(shlex.quote(a) for a in [PROG, *argv])


def environment(device: torch.device) -> dict:
    from . import allocator, machine

    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": machine.cpu_model(),
        "cpu_threads": torch.get_num_threads(),
        "device": str(device),
        "allocator": allocator.IN_USE or allocator.describe(),
    }
    env.update({k: os.environ[k] for k in ("OMP_NUM_THREADS",) if k in os.environ})
    if hasattr(os, "getloadavg"):  # how busy the machine was: other work shows in the times
        env["load_average"] = [round(v, 2) for v in os.getloadavg()]
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    import mhc_sp

    env["mhc_sp_build"] = mhc_sp.build_info()
    return env


# ---- numbers --------------------------------------------------------------------------------


def fmt_ratio(v: float) -> str:
    return f"{v:.2f}"


def fmt_number(v: float) -> str:
    """Three significant digits; whole numbers from 1000 up."""
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def is_ratio(key: str) -> bool:
    return key.endswith("_x") or key.startswith("x_")


def fmt_value(key: str, v) -> str:
    """One cell: a ratio, a measured number, or anything else as text (None: ``-``)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return fmt_ratio(v) if is_ratio(key) else fmt_number(v)
    return str(v)


#: A printed column: a header, and how a row becomes its cell.
Column = tuple[str, Callable[[dict], str]]


def col(key: str, header: Optional[str] = None) -> Column:
    """A column showing ``row[key]``."""
    return header or key, lambda r: fmt_value(key, r.get(key))


def interval_col(header: str, key: str, lo: str, hi: str) -> Column:
    """A column showing ``row[key] [row[lo]-row[hi]]`` (a median and its spread or interval)."""

    def cell(r: dict) -> str:
        if r.get(key) is None:
            return "-"
        return f"{fmt_value(key, r[key])} [{fmt_value(key, r[lo])}-{fmt_value(key, r[hi])}]"

    return header, cell


def spread_col(key: str, header: Optional[str] = None) -> Column:
    """``median [p10-p90]`` of a time ``<name>_<unit>`` whose spread is ``<name>_p10_<unit>`` and
    ``<name>_p90_<unit>``."""
    name, unit = key.rsplit("_", 1)
    header = header or f"{key} [p10-p90]"
    return interval_col(header, key, f"{name}_p10_{unit}", f"{name}_p90_{unit}")


def format_table(rows: Sequence[dict], columns: Sequence[Union[str, Column]]) -> str:
    columns = [col(c) if isinstance(c, str) else c for c in columns]
    cells = [[render(r) for _, render in columns] for r in rows]
    widths = [
        max([len(header)] + [len(row[i]) for row in cells]) for i, (header, _) in enumerate(columns)
    ]
    lines = ["  ".join(h.rjust(w) for (h, _), w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


# ---- files ----------------------------------------------------------------------------------


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
        f.write("\n")


def write_csv(rows: Sequence[dict], command: str, path: str) -> None:
    """Every field of every row: the union of the rows' keys, in the order they first appear."""
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        f.write(f"# {command}\n")
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)


def write_plot(path: str, command: str, draw: Callable) -> None:
    """A figure drawn by ``draw(ax)``, titled with the command line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    draw(ax)
    ax.set_title(command, fontsize=7, wrap=True)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def log2_tokens_axis(ax, label: str = "tokens") -> None:
    """A log2 axis of token counts labelled with plain numbers."""
    from matplotlib.ticker import ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel(label)


def mark_crossover(ax, tokens: Optional[int], label: str) -> None:
    """A dashed vertical line where SP starts to pay off (nothing when it never does)."""
    if tokens is None:
        return
    ax.axvline(tokens, linestyle="--", color="0.35", linewidth=1)
    ax.annotate(
        label,
        xy=(tokens, 1),
        xycoords=("data", "axes fraction"),
        xytext=(3, -12),
        textcoords="offset points",
        fontsize=7,
        color="0.25",
    )


def publish(doc: dict, args, present: Callable[[dict], tuple]) -> None:
    """Print a run's document and write the files the user asked for. ``present(doc)`` (each
    subcommand's) returns the lines printed before the table, the table's columns, the lines
    printed after it, and ``plot(ax, doc)`` (or None); ``mhc-sp-bench show`` prints a recorded
    document the same way."""
    intro, columns, lines, plot = present(doc)
    print(f"# {doc['command']}")
    for line in intro:
        print(line)
    print(format_table(doc["rows"], columns))
    for line in lines:
        print(line)
    write_outputs(doc, args, plot)


def write_outputs(doc: dict, args, plot: Optional[Callable] = None) -> None:
    """The ``--json``, ``--csv`` and ``--plot`` files of a run, each named on stderr."""
    written = []
    if getattr(args, "json", None):
        write_json(doc, args.json)
        written.append(args.json)
    if getattr(args, "csv", None):
        write_csv(doc["rows"], doc["command"], args.csv)
        written.append(args.csv)
    if getattr(args, "plot", None) and plot is not None:
        write_plot(args.plot, doc["command"], lambda ax: plot(ax, doc))
        written.append(args.plot)
    if written:
        print(f"{PROG}: wrote {', '.join(written)}", file=sys.stderr)


# ---- progress -------------------------------------------------------------------------------


class Progress:
    """``label: step k/n, 12 s`` on stderr: redrawn in place on a terminal, otherwise a line at
    most every ``every_s`` seconds (and the last step), so long runs show that they move."""

    def __init__(self, label: str, total: int, every_s: float = 5.0):
        self.label, self.total, self.every_s = label, total, every_s
        self.start = self.last = time.monotonic()
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: Optional[int] = None, what: str = "") -> None:
        self.total = total or self.total
        now = time.monotonic()
        final = done >= self.total
        what = f" {what}" if what else ""
        text = f"{self.label}: {done}/{self.total}{what}, {now - self.start:.0f} s"
        if self.tty:
            print(f"\r{text}".ljust(72), end="\n" if final else "", file=sys.stderr, flush=True)
        elif final or now - self.last >= self.every_s:
            print(text, file=sys.stderr, flush=True)
            self.last = now


def progress(items, label: str):
    """Yield ``items`` while reporting ``label k/n`` on stderr (:class:`Progress`)."""
    items = list(items)
    show = Progress(label, len(items))
    for k, item in enumerate(items, 1):
        yield item
        show(k, what=str(item))
