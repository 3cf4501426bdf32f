# SPDX-License-Identifier: Apache-2.0
"""Value checks shared by the config classes; each error message starts with the field's name."""

from __future__ import annotations

from typing import Any


def check_positive_int(value: Any, name: str) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an int >= 1 (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_non_negative_int(value: Any, name: str) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an int >= 0 (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
