# SPDX-License-Identifier: Apache-2.0
"""From measured boundary times to ``--sp-threshold``: the one rule, and the words that explain
it. ``tune`` and ``layer`` both decide with it.

A row is one token count: ``tokens``, and ``speedup_x`` with its interval ``speedup_lo_x`` ..
``speedup_hi_x`` (replicated time / sharded time, from paired samples). SP is *faster* at a
count when the whole interval lies above 1.0, *slower* when it lies below, and *not settled*
otherwise. The recommended threshold is the smallest measured count above the CUDA graph capture
size at which SP is faster, and faster at every larger measured count too: a count that noise
could tip either way never lowers it."""

from __future__ import annotations

from typing import Optional, Sequence

from .report import fmt_ratio

FASTER, SLOWER, UNSETTLED = "with SP", "without SP", "not settled"
#: How sure the speedup's interval is (a confidence interval of the median paired ratio).
CONFIDENCE = 0.95


def classify(row: dict) -> str:
    """Which way is faster at this row's count, judged by the speedup's interval."""
    if row["speedup_lo_x"] > 1.0:
        return FASTER
    if row["speedup_hi_x"] < 1.0:
        return SLOWER
    return UNSETTLED


def recommend(rows: Sequence[dict], max_capture: int = 0) -> Optional[int]:
    """The smallest measured count above ``max_capture`` from which SP is faster at that count and
    at every larger one; None when SP is not faster at the largest count."""
    best = None
    for row in sorted(rows, key=lambda r: r["tokens"], reverse=True):
        if row["tokens"] <= max_capture or classify(row) != FASTER:
            break
        best = row["tokens"]
    return best


def speedup_text(row: dict) -> str:
    """``1.23x [1.18-1.30]``: the speedup and its interval, as the table shows them."""
    return (
        f"{fmt_ratio(row['speedup_x'])}x "
        f"[{fmt_ratio(row['speedup_lo_x'])}-{fmt_ratio(row['speedup_hi_x'])}]"
    )


def tokens_text(counts: Sequence[int]) -> str:
    """``1 token``, ``4 and 16 tokens``, ``1, 4 and 16 tokens``."""
    names = [str(c) for c in counts]
    joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return joined + (" token" if counts == [1] else " tokens")


def verdict(
    rows: Sequence[dict], threshold: Optional[int], tp: int, max_capture: int, repeats: int
) -> list[str]:
    """The conclusion in words, generated from the rows and the threshold :func:`recommend`
    chose; its last line is ``recommended: ...``."""
    rows = sorted(rows, key=lambda r: r["tokens"])
    top = rows[-1]
    graphs = [r for r in rows if r["tokens"] <= max_capture]
    lines = []
    if threshold is None:
        if classify(top) == SLOWER:
            lines.append(
                f"SP is slower at {tokens_text([top['tokens']])}, the largest count measured "
                f"(speedup {speedup_text(top)}): it does not pay off in this range. Leave it "
                f"off, or measure larger counts with --tokens."
            )
        else:
            lines.append(
                f"Not settled: at {tokens_text([top['tokens']])}, the largest count measured, "
                f"the speedup's interval {speedup_text(top)} includes 1.0. Rerun with "
                f"--repeats {4 * repeats} (about halves the interval) or measure larger counts "
                f"with --tokens."
            )
    else:
        at = next(r for r in rows if r["tokens"] == threshold)
        first = (
            f"SP (the stream split over {tp} ranks) is faster from {tokens_text([threshold])} "
            f"on: {speedup_text(at)} at {threshold}"
        )
        if top is at:
            first += ", the largest count measured."
        else:
            first += f", {speedup_text(top)} at {top['tokens']}."
        lines.append(first)
        below = [r for r in rows if max_capture < r["tokens"] < threshold]
        parts = []
        for kind, words in (
            (SLOWER, "slower at {}"),
            (UNSETTLED, "not settled at {} (the interval includes 1.0)"),
            (FASTER, "faster at {}, but not at every larger count"),
        ):
            counts = [r["tokens"] for r in below if classify(r) == kind]
            if counts:
                parts.append(words.format(tokens_text(counts)))
        if parts:
            lines.append(f"Below {threshold}, SP is " + "; ".join(parts) + ".")
        unsettled = [r["tokens"] for r in below if classify(r) == UNSETTLED]
        if unsettled:
            lines.append(
                f"Rerun with --repeats {4 * repeats} to settle {tokens_text(unsettled)}: "
                f"narrower intervals may lower the threshold."
            )
    if graphs:
        lines.append(
            f"Counts up to {max_capture} run as CUDA graphs (--max-cudagraph-capture-size), "
            f"where SP must not engage."
        )
    lines.append(
        "recommended: leave --sp-threshold unset (SP off)"
        if threshold is None
        else f"recommended: --sp-threshold {threshold}"
    )
    return lines
