# SPDX-License-Identifier: Apache-2.0
"""Which transport :func:`mhc_sp.distributed.init` gives a group, and why.

A device family is its transports in the order ``"auto"`` prefers them (``mhc_sp.transports.TABLE``;
the last serves every group). Each transport's module answers two questions about a group:
``unusable(group)``, None where it can serve the group, else an :class:`Unusable` (why not, and
the error when it is requested anyway), absent where it serves every group; and
``reason(requested, group, unusable)``, why it was picked. :func:`choose` asks them the same way
for every family: a requested transport must be able to serve the group (else a ValueError saying
why it cannot), ``"auto"`` takes the first that can. Its answer is a :class:`Choice`: the
transport picked, why (``transport(...).reason``), and why each other one of the family was not.

A check may be collective (it gathers facts from every rank), so :func:`choose` asks only where
the answer matters: the requested transport, for ``"auto"`` each one up to the first that can
serve, and every one whose module sets ``ALWAYS_ASKED`` (its facts are gathered in every setup of
its family, and its answer is reported whichever transport is picked). Every rank gets the same
facts, so every rank picks the same transport. The answers are kept by group and device
(:func:`record`, :func:`reason`) until :func:`forget`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Choice:
    """A group's transport for one device family, as ``init`` picked it."""

    transport: str
    #: Why ``transport`` (``mhc_sp.distributed.transport(...).reason``).
    reason: str
    #: Every other transport of the family, with why it was not picked.
    passed_over: Mapping[str, str]


@dataclass(frozen=True)
class Unusable:
    """Why a transport cannot serve a group: ``why`` for the reason of the one picked instead,
    ``error`` for the ValueError when it is requested anyway."""

    why: str
    error: str


def _check_requested(family: Sequence[ModuleType], requested: str) -> None:
    names = [t.NAME for t in family]
    if requested not in ("auto", *names):
        listed = ", ".join(map(repr, ("auto", *names[:-1])))
        raise ValueError(
            f"transport: expected {listed} or {names[-1]!r} for {family[0].DEVICE}, "
            f"got {requested!r}"
        )


def choose(family: Sequence[ModuleType], requested: str, group) -> Choice:
    """The transport of ``family`` (one device's transports, in the order ``"auto"`` prefers
    them) that ``group`` gets for ``requested`` (``"auto"`` or one of their names)."""
    _check_requested(family, requested)
    unusable: dict[str, Unusable] = {}
    first = None  # for "auto": the first transport that can serve the group
    for t in family:
        check = getattr(t, "unusable", None)
        asked = (
            requested == t.NAME
            or getattr(t, "ALWAYS_ASKED", False)
            or (requested == "auto" and first is None)
        )
        problem = check(group) if asked and check is not None else None
        if problem is not None:
            unusable[t.NAME] = problem
        elif asked and first is None:
            first = t.NAME
    if requested in unusable:
        raise ValueError(unusable[requested].error)
    picked = requested if requested != "auto" else first
    passed_over = {}
    for t in family:
        if t.NAME == picked:
            continue
        if t.NAME in unusable:
            passed_over[t.NAME] = unusable[t.NAME].why
        elif requested != "auto":
            passed_over[t.NAME] = "not requested"
        else:
            passed_over[t.NAME] = f"{picked!r} comes first"
    module = next(t for t in family if t.NAME == picked)
    return Choice(picked, module.reason(requested, group, unusable), passed_over)


#: The Choice of each group's transport, by (group name, device type).
_CHOICES: dict[tuple[str, str], Choice] = {}


def record(name: str, device_type: str, choice: Choice) -> None:
    """Keep why group ``name`` got its ``device_type`` transport."""
    _CHOICES[(name, device_type)] = choice


def reason(name: str, device_type: str) -> str | None:
    """Why group ``name`` got its ``device_type`` transport (None where none was chosen)."""
    choice = _CHOICES.get((name, device_type))
    return None if choice is None else choice.reason


def forget() -> None:
    """Forget every group's choices (their transports belong to the C++ registry)."""
    _CHOICES.clear()
