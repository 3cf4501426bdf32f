# SPDX-License-Identifier: Apache-2.0
"""From measured boundary times to ``--sp-threshold``: the one rule, and the words that explain
it. ``tune`` and ``layer`` both decide with it.

A row is one token count: ``tokens``, and ``speedup_x`` with its interval ``speedup_lo_x`` ..
``speedup_hi_x`` (replicated time / sharded time, from paired samples, a 95% confidence interval
of the median ratio). Two times closer than :data:`MARGIN` (5%) are not told apart: that is about
how much the medians of identical runs drift on a machine shared with other work, so a rule that
acted on smaller differences would act on noise. Each count is therefore one of:

* *faster* with SP: the whole interval lies above 1 + MARGIN;
* *slower* with SP: the whole interval lies below 1 - MARGIN;
* *equivalent*: the whole interval lies within 1 +- MARGIN (SP neither helps nor costs more
  than the margin);
* *not settled*: the interval reaches across 1 + MARGIN or 1 - MARGIN (more rounds may settle
  it; ``tune`` gives such counts more rounds first).

The recommended threshold is the smallest measured count above the CUDA graph capture size from
which SP is faster at that count and at every larger one. The counts below it, above the last
one where SP is slower, at which SP is equivalent or not settled form the *band* where SP and no
SP are not told apart within the measurement's resolution; the recommendation is the count above
the band, and the verdict states what choosing the band's lower end instead would cost (the
worst case of the intervals there). Noise that keeps a band count's
interval within the band (below 1 + MARGIN) can never move the answer: only a count shown faster
by more than the margin, at it and every larger count, can be the threshold."""

from __future__ import annotations

from typing import Optional, Sequence

from .report import fmt_ratio

FASTER, SLOWER, EQUIVALENT, UNSETTLED = "with SP", "without SP", "equivalent", "not settled"
#: How sure the speedup's interval is (a confidence interval of the median paired ratio).
CONFIDENCE = 0.95
#: Relative differences smaller than this are within the measurement's resolution.
MARGIN = 0.05


def classify(row: dict) -> str:
    """Which way is faster at this row's count, judged by the speedup's interval and
    :data:`MARGIN`."""
    lo, hi = row["speedup_lo_x"], row["speedup_hi_x"]
    if lo > 1.0 + MARGIN:
        return FASTER
    if hi < 1.0 - MARGIN:
        return SLOWER
    if lo >= 1.0 - MARGIN and hi <= 1.0 + MARGIN:
        return EQUIVALENT
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


def band(rows: Sequence[dict], threshold: Optional[int], max_capture: int = 0) -> list[dict]:
    """The rows below ``threshold`` (all rows when None), above ``max_capture`` and above the
    largest count where SP is slower, at which SP and no SP are not told apart (equivalent or
    not settled)."""
    rows = sorted((r for r in rows if r["tokens"] > max_capture), key=lambda r: r["tokens"])
    below = [r for r in rows if threshold is None or r["tokens"] < threshold]
    slower = [k for k, r in enumerate(below) if classify(r) == SLOWER]
    above_slower = below[slower[-1] + 1 :] if slower else below
    return [r for r in above_slower if classify(r) in (EQUIVALENT, UNSETTLED)]


def refine_between(rows: Sequence[dict], max_capture: int = 0) -> list[int]:
    """Counts to measure next, between the band's upper end and the next smaller measured count
    (powers of two apart, the measured ones excluded), so that the threshold is found on a finer
    grid than the sweep's; empty when the crossover is already between neighbouring powers of
    two or not in the measured range."""
    threshold = recommend(rows, max_capture)
    if threshold is None:
        return []
    below = [r["tokens"] for r in rows if max_capture < r["tokens"] < threshold]
    if not below:
        return []
    measured = {r["tokens"] for r in rows}
    counts, c = [], 2 * max(below)
    while c < threshold:
        if c not in measured:
            counts.append(c)
        c *= 2
    return counts


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
    return joined + (" token" if list(counts) == [1] else " tokens")


def lower_end_cost(in_band: Sequence[dict]) -> str:
    """What ``--sp-threshold`` at the band's lower end would cost: SP engaged at every band count,
    at worst as slow as the lowest end of their intervals."""
    worst = min(in_band, key=lambda r: r["speedup_lo_x"])
    low = in_band[0]["tokens"]
    if worst["speedup_lo_x"] >= 1.0:
        return (
            f"--sp-threshold {low} instead (the band's lower end) costs nothing measurable: SP "
            f"is at worst as fast there."
        )
    slower = 100 * (1 / worst["speedup_lo_x"] - 1)
    return (
        f"--sp-threshold {low} instead (the band's lower end) engages SP where a boundary may "
        f"take up to {slower:.0f}% longer: {speedup_text(worst)} at {worst['tokens']}."
    )


#: A verdict's words for counts below the threshold where SP is faster all the same.
NOT_FROM_THERE = "SP is faster at {} too, but not by the margin at every larger count."


def verdict(rows: Sequence[dict], threshold: Optional[int], tp: int, max_capture: int) -> list[str]:
    """The conclusion in words, generated from the rows and the threshold :func:`recommend`
    chose; its last line is ``recommended: ...``."""
    rows = sorted(rows, key=lambda r: r["tokens"])
    top = rows[-1]
    margin = f"{MARGIN:.0%}"
    graphs = [r for r in rows if r["tokens"] <= max_capture]
    in_band = band(rows, threshold, max_capture)
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
                f"SP is not shown faster by more than {margin} at "
                f"{tokens_text([top['tokens']])}, the largest count measured (speedup "
                f"{speedup_text(top)}). Leave it off, or measure larger counts with --tokens."
            )
    else:
        at = next(r for r in rows if r["tokens"] == threshold)
        first = (
            f"SP (the stream split over {tp} ranks) is faster by more than {margin} from "
            f"{tokens_text([threshold])} on: {speedup_text(at)} at {threshold}"
        )
        if top is at:
            first += ", the largest count measured."
        else:
            first += f", {speedup_text(top)} at {top['tokens']}."
        lines.append(first)
        if in_band:
            counts = [r["tokens"] for r in in_band]
            lines.append(
                f"Band: at {tokens_text(counts)} SP and no SP are not told apart (within "
                f"{margin}, or intervals reaching across it); the recommendation is the count "
                f"above the band. " + lower_end_cost(in_band)
            )
        for kind, words in ((SLOWER, "SP is slower at {}."), (FASTER, NOT_FROM_THERE)):
            counts = [
                r["tokens"]
                for r in rows
                if max_capture < r["tokens"] < threshold and classify(r) == kind
            ]
            if counts:
                lines.append(words.format(tokens_text(counts)))
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
