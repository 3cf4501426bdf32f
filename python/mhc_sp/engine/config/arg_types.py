# SPDX-License-Identifier: Apache-2.0
"""argparse value types: the one home of every flag's domain, for the engine's flags
(:mod:`.engine_args`) and the benchmark tool's (:mod:`mhc_sp.bench.flags`). Each returns the
parsed value or raises ``argparse.ArgumentTypeError`` saying what it expected, which argparse
reports in one line naming the flag."""

from __future__ import annotations

import argparse
from typing import Callable, Optional, Sequence

from .parallel import MAX_NUM_TOKENS


def _int_at_least(text: str, lo: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < lo:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def optional_token_count(text: str) -> Optional[int]:
    """argparse type: an integer in ``[1, MAX_NUM_TOKENS]``, or None for ``"None"`` or ``""``
    (the engine's optional integers read those two as None)."""
    if text in ("", "None"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer or None, got {text!r}"
        ) from None
    if not 1 <= value <= MAX_NUM_TOKENS:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer at most {MAX_NUM_TOKENS} (2**31 - 1, the most tokens "
            f"a forward can have) or None, got {text!r}"
        )
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


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
