# SPDX-License-Identifier: Apache-2.0
"""Which transport :func:`mhc_sp.distributed.init` gives a group, and why.

Each device family lists its transports in the order ``"auto"`` prefers them
(:data:`PREFERENCE`; the last serves every group). One function per family turns the facts
``init`` gathered into the family's transports that cannot serve the group, each with why, and
picks one the same way for both: the requested transport, which must be able to serve the group
(else a ValueError saying why it cannot), or for ``"auto"`` the first one that can. Its answer is
a :class:`Choice`: the transport picked, why (``transport(...).reason``), and why each other one
of the family was not picked.

- :func:`choose_cpu`: ``shm`` needs every rank on rank 0's host (:func:`mhc_sp.distributed.hosts`);
  ``gloo`` serves any group.
- :func:`choose_cuda`: ``symm`` needs at most ``max_world`` ranks and every rank able to use every
  other rank's GPU memory (:func:`mhc_sp._symm.peer_problems`); ``nccl`` serves any group.

Every rank gets the same facts, so every rank picks the same transport. The answers are kept by
group and device (:func:`record`, :func:`reason`) until :func:`forget`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: Each device family's transports, in the order ``"auto"`` prefers them; the last serves any group.
PREFERENCE: dict[str, tuple[str, ...]] = {"cpu": ("shm", "gloo"), "cuda": ("symm", "nccl")}


@dataclass(frozen=True)
class Choice:
    """A group's transport for one device family, as ``init`` picked it."""

    transport: str
    #: Why ``transport`` (``mhc_sp.distributed.transport(...).reason``).
    reason: str
    #: Every other transport of the family, with why it was not picked.
    passed_over: Mapping[str, str]


@dataclass(frozen=True)
class _Unusable:
    """Why a transport cannot serve a group: ``why`` for the reason of the one picked instead,
    ``error`` for the ValueError when it is requested anyway."""

    why: str
    error: str


def _check_requested(device_type: str, requested: str) -> None:
    family = PREFERENCE[device_type]
    if requested not in ("auto", *family):
        names = ", ".join(map(repr, ("auto", *family[:-1])))
        raise ValueError(
            f"transport: expected {names} or {family[-1]!r} for {device_type}, got {requested!r}"
        )


def _pick(
    device_type: str, requested: str, unusable: Mapping[str, _Unusable]
) -> tuple[str, dict[str, str]]:
    """(the transport picked, why each other one was not) of a family, given which of its
    transports cannot serve the group."""
    if requested in unusable:
        raise ValueError(unusable[requested].error)
    family = PREFERENCE[device_type]
    picked = requested if requested != "auto" else next(t for t in family if t not in unusable)
    passed_over = {}
    for t in family:
        if t == picked:
            continue
        if t in unusable:
            passed_over[t] = unusable[t].why
        elif requested != "auto":
            passed_over[t] = "not requested"
        else:
            passed_over[t] = f"{picked!r} comes first"
    return picked, passed_over


def choose_cpu(requested: str, name: str, host: Sequence[int], why: Sequence[str]) -> Choice:
    """The CPU transport of group ``name`` for ``requested`` (``"auto"``, ``"shm"``, ``"gloo"``),
    given ``(host, why)`` of :func:`mhc_sp.distributed.hosts`."""
    _check_requested("cpu", requested)
    elsewhere = [r for r in range(len(host)) if host[r] != 0]
    detail = "; ".join(f"rank {r}: {why[r]}" for r in elsewhere)
    unusable = {}
    if elsewhere:
        fact = f"ranks {elsewhere} are not on rank 0's host ({detail})"
        unusable["shm"] = _Unusable(
            fact,
            f"transport: 'shm' needs every rank of group {name!r} on one host; ranks "
            f"{elsewhere} do not share rank 0's host (use 'gloo' or 'auto'): {detail}",
        )
    else:
        fact = (
            "every rank is on rank 0's host (one kernel boot and PID namespace, and each rank "
            "found a shared-memory segment of every other)"
        )
    picked, passed_over = _pick("cpu", requested, unusable)
    return Choice(picked, f"{requested!r} requested: {fact}", passed_over)


def choose_cuda(
    requested: str,
    name: str,
    world: int,
    max_world: int,
    peer_problems: Callable[[], Sequence[Mapping[int, str]]],
) -> Choice:
    """The CUDA transport of group ``name`` (``world`` ranks) for ``requested`` (``"auto"``,
    ``"symm"``, ``"nccl"``). ``peer_problems()`` gives, for every rank, the peers whose GPU memory
    it cannot use, each with why (the same list on every rank); it is collective, and called only
    where the choice depends on it (not for ``"nccl"``, nor for more than ``max_world`` ranks)."""
    _check_requested("cuda", requested)
    unusable = {}
    # For "nccl" nothing about symm matters (and finding it out is collective).
    if requested != "nccl" and world > max_world:
        unusable["symm"] = _Unusable(
            f"symm takes at most {max_world} ranks",
            f"transport: 'symm' takes at most {max_world} ranks, group {name!r} has {world}",
        )
    elif requested != "nccl":
        problems = peer_problems()
        pairs = [
            (r, p, why) for r, peers in enumerate(problems) for p, why in sorted(peers.items())
        ]
        if pairs:
            r, p, why = pairs[0]
            unusable["symm"] = _Unusable(
                f"rank {r} cannot use rank {p}'s GPU memory: {why}",
                f"transport: 'symm' needs every rank of group {name!r} to map every other "
                f"rank's GPU memory (one host, peer access with native atomics); rank {r} cannot "
                f"use rank {p}'s: {why} (use 'nccl' or 'auto')",
            )
    picked, passed_over = _pick("cuda", requested, unusable)
    if picked == "nccl":
        reason = "requested" if requested == "nccl" else unusable["symm"].why
    else:
        fact = "every rank maps every other rank's GPU memory with native atomics"
        reason = fact if requested == "auto" else f"requested; {fact}"
    return Choice(picked, reason, passed_over)


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
