# SPDX-License-Identifier: Apache-2.0
"""From measured boundary times to ``--sp-threshold``: the one rule, and the words that explain
it. ``tune`` decides with it; ``layer`` reports where SP beats no SP with :func:`faster_from`.

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

The recommended threshold (:func:`recommend`) is the smallest measured count, above the CUDA
graph capture size, from which SP is never measurably slower: the count above the largest one
where SP is slower, or the smallest count measured when there is none. It needs SP faster at
one count at least from there on; without one SP does not pay off in the measured range and
there is no threshold. From the threshold up to the first count where SP is faster, SP and no SP
are not told apart: that is the *band* (:func:`band`), and every threshold from its lower end to
that faster count costs the same within the measurement's resolution (:func:`same_cost`).

Why the lower end: a count whose speedup lies near 1 + MARGIN comes out faster in one run and
not settled in the next, and a rule that waited for "faster" (the band's upper end) answered 1
in one run and 4 in the next for the same machine. Noise inside the margin moves a count only
between faster, equivalent and not settled; that moves the band's upper end and never the
threshold. Only a count shown slower by more than the margin (or no longer shown so) moves it."""

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


def _above(rows: Sequence[dict], max_capture: int) -> list[dict]:
    """The rows above the capture size (SP never engages on a captured size), by count."""
    return sorted((r for r in rows if r["tokens"] > max_capture), key=lambda r: r["tokens"])


def last_slower(rows: Sequence[dict], max_capture: int = 0) -> Optional[int]:
    """The largest count above ``max_capture`` at which SP is slower; None when there is none."""
    slower = [r["tokens"] for r in _above(rows, max_capture) if classify(r) == SLOWER]
    return slower[-1] if slower else None


def _candidates(rows: Sequence[dict], max_capture: int) -> list[dict]:
    """The rows above ``max_capture`` and above the largest count where SP is slower."""
    floor = last_slower(rows, max_capture)
    return [r for r in _above(rows, max_capture) if floor is None or r["tokens"] > floor]


def recommend(rows: Sequence[dict], max_capture: int = 0) -> Optional[int]:
    """The smallest measured count above ``max_capture`` from which SP is never slower (above
    the largest count where it is); None when SP is faster at none of the counts from there on
    (it does not pay off in the measured range)."""
    candidates = _candidates(rows, max_capture)
    if not any(classify(r) == FASTER for r in candidates):
        return None
    return candidates[0]["tokens"]


def band(rows: Sequence[dict], max_capture: int = 0) -> list[dict]:
    """The rows from the recommended threshold up to the first count where SP is faster, at which
    SP and no SP are not told apart (equivalent or not settled); empty when SP is faster at the
    threshold already, or when there is no threshold."""
    if recommend(rows, max_capture) is None:
        return []
    candidates = _candidates(rows, max_capture)
    faster = next(k for k, r in enumerate(candidates) if classify(r) == FASTER)
    return candidates[:faster]


def same_cost(rows: Sequence[dict], max_capture: int = 0) -> Optional[tuple[int, int]]:
    """The thresholds that cost the same within the measurement's resolution: from the recommended
    one to the first count where SP is faster (the same count when SP is faster there already);
    None when there is no threshold."""
    threshold = recommend(rows, max_capture)
    if threshold is None:
        return None
    candidates = _candidates(rows, max_capture)
    return threshold, next(r["tokens"] for r in candidates if classify(r) == FASTER)


def faster_from(rows: Sequence[dict], max_capture: int = 0) -> Optional[int]:
    """The smallest measured count above ``max_capture`` from which SP is faster at that count and
    at every larger one; None when SP is not faster at the largest count. ``layer`` reports this
    crossover; the threshold is :func:`recommend`'s, which noise inside the margin cannot move."""
    best = None
    for row in reversed(_above(rows, max_capture)):
        if classify(row) != FASTER:
            break
        best = row["tokens"]
    return best


def refine_between(rows: Sequence[dict], max_capture: int = 0) -> list[int]:
    """Counts to measure next, between the largest count where SP is slower and the threshold
    above it (powers of two apart, the measured ones excluded), so that the threshold is found on
    a finer grid than the sweep's; empty when nothing is slower, when they are neighbouring
    powers of two, or without a threshold."""
    threshold, floor = recommend(rows, max_capture), last_slower(rows, max_capture)
    if threshold is None or floor is None:
        return []
    measured = {r["tokens"] for r in rows}
    counts, c = [], 2 * floor
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


def band_cost(in_band: Sequence[dict]) -> str:
    """What SP costs at worst in the band, where the recommended threshold engages it: the lowest
    end of the intervals there."""
    worst = min(in_band, key=lambda r: r["speedup_lo_x"])
    if worst["speedup_lo_x"] >= 1.0:
        return "There SP is at worst as fast."
    slower = 100 * (1 / worst["speedup_lo_x"] - 1)
    return (
        f"There SP may cost up to {slower:.0f}% more: {speedup_text(worst)} at {worst['tokens']}."
    )


#: The rule in one line, as ``tune`` prints it above its table.
RULE = "--sp-threshold: the smallest count from which SP is never slower by more than {margin}."


def verdict(rows: Sequence[dict], tp: int, max_capture: int) -> list[str]:
    """The conclusion in words, generated from the rows by :func:`recommend`'s rule; its last line
    is ``recommended: ...``."""
    rows = sorted(rows, key=lambda r: r["tokens"])
    top = rows[-1]
    margin = f"{MARGIN:.0%}"
    threshold = recommend(rows, max_capture)
    above = _above(rows, max_capture)
    floor = last_slower(rows, max_capture)
    lines = []
    if not above:
        lines.append(
            f"No count above the CUDA graph capture size ({max_capture}) was measured: SP never "
            f"engages on a captured size. Measure larger counts with --tokens."
        )
    elif threshold is None:
        if floor == top["tokens"]:
            lines.append(
                f"SP is slower at {tokens_text([top['tokens']])}, the largest count measured "
                f"(speedup {speedup_text(top)}): it does not pay off in this range. Leave it "
                f"off, or measure larger counts with --tokens."
            )
        else:
            where = "at any count measured"
            if floor is not None:
                where = f"at any count above {floor}, where it is slower,"
            elif max_capture:
                where = f"at any count measured above {max_capture}"
            lines.append(
                f"SP is not shown faster by more than {margin} {where} up to "
                f"{tokens_text([top['tokens']])}, the largest count measured (speedup "
                f"{speedup_text(top)}). Leave it off, or measure larger counts with --tokens."
            )
    else:
        at = next(r for r in rows if r["tokens"] == threshold)
        in_band = band(rows, max_capture)
        first = (
            f"SP (the stream split over {tp} ranks) is never slower by more than {margin} from "
            f"{tokens_text([threshold])} on"
        )
        if threshold == rows[0]["tokens"]:
            first += ", the smallest count measured"
        elif floor is None:
            first += f", the smallest count above the capture size {max_capture}"
        if not in_band:
            first += ("," if floor is None else "") + f" and faster by more than {margin} there"
        first += f": {speedup_text(at)} at {threshold}"
        if top is at:
            first += ", the largest count measured."
        else:
            first += f", {speedup_text(top)} at {top['tokens']}."
        lines.append(first)
        if in_band:
            _, faster = same_cost(rows, max_capture)
            at_faster = next(r for r in rows if r["tokens"] == faster)
            lines.append(
                f"Band: at {tokens_text([r['tokens'] for r in in_band])} SP and no SP are not told "
                f"apart (within {margin}, or not settled); SP is faster by more "
                f"than {margin} at {faster}: {speedup_text(at_faster)} at {faster}. Thresholds "
                f"{threshold} to {faster} cost the same; the lowest is recommended, as noise "
                f"within {margin} cannot move it. " + band_cost(in_band)
            )
        below = [r for r in above if r["tokens"] < threshold]
        for kinds, words in (
            ((SLOWER,), "SP is slower at {}."),
            ((FASTER,), "SP is faster at {} too, but slower at a larger count."),
            (
                (EQUIVALENT, UNSETTLED),
                "At {} SP and no SP are not told apart, but SP is slower at a larger count.",
            ),
        ):
            counts = [r["tokens"] for r in below if classify(r) in kinds]
            if counts:
                lines.append(words.format(tokens_text(counts)))
    if any(r["tokens"] <= max_capture for r in rows):
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
