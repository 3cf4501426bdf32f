# SPDX-License-Identifier: Apache-2.0
"""Process groups for mhc_sp's collective and fused ops.

The ops take a group *name* (``pg.group_name``; ``"0"`` is WORLD). A group must be registered
with :func:`init` on every rank before ops use it. ``init`` fixes the group's **transport** for
the device it names; the op schemas never change with it:

* CPU tensors: ``"shm"``, a shared-memory workspace for ranks on one host, on which
  ``fused_layer``/``fused_entry``/``fused_head`` run as one pass (every rank sums the partial
  rows of its tokens straight from its peers' memory inside the mHC post+pre, in fp32 in rank
  order); or ``"gloo"``, the group's own gloo backend (a group created with backend ``"gloo"`` or
  ``"cpu:gloo,cuda:nccl"``), which also crosses hosts. ``"auto"`` picks shm when every rank of
  the group runs on this host (:func:`hosts`: one kernel boot and PID namespace, shared memory
  that every rank can open), gloo otherwise.
* CUDA tensors: ``"symm"``, a buffer per rank from torch symmetric memory that every rank maps
  (one host, CUDA peer access between every pair of the group's GPUs), on which ``fused_layer``
  runs as one kernel (replicated, up to 16 tokens) or two (sharded) that sum the partial rows in
  fp32 in rank order from the peers' memory, and the plain collectives run over the buffers; or
  ``"nccl"``, an NCCL communicator that ``init`` creates for the group (rank 0 makes the unique
  id, the group broadcasts it, every rank joins on its current CUDA device). symm keeps an NCCL
  communicator for calls that do not fit its buffers. Both enqueue on the current CUDA stream;
  symm orders a group's calls issued on different streams one after the other. ``"auto"`` picks
  symm when every rank can map every other rank's GPU memory with native atomics (NVLink), NCCL
  otherwise; ``transport(...).reason`` says why.
* A world of one needs no transport (``transport()`` reports ``"local"``): ``init()`` without
  torch.distributed registers ``"0"`` as a single-rank group, so single-device engines call the
  same ops.

A peer that dies or stalls makes the shm ops raise within the group's timeout (the process
group's own, unless ``init(timeout=...)`` sets one), naming the rank; the workspace is then
broken and later calls raise at once until ``init`` is called again on every rank. The symm
kernels give up on a peer after the same timeout, record the failure and fill what the failed
call could not compute with NaN; from then on every call on the group is refused (its outputs are
NaN, also under CUDA-graph replay) and every eager op raises, naming the rank, once the rank has
recorded the failure (a rank that was not in the failed call records it in its next call).
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from . import _C, transports
from .transports import choice as _choice
from .transports import hosts as _hosts
from .transports import symm as _symm

GroupLike = ProcessGroup | str | None

#: Group name used for WORLD (and for the single-rank group registered without torch.distributed).
WORLD = "0"

#: Transports ``init`` accepts per device type ("auto" first, then the order "auto" prefers).
TRANSPORTS = {device: ("auto", *family) for device, family in transports.PREFERENCE.items()}


def group_name(group: GroupLike) -> str:
    """The name the ops take for ``group`` (None = WORLD)."""
    if isinstance(group, str):
        return group
    if group is None and not dist.is_initialized():
        return WORLD
    if group is None:
        group = dist.group.WORLD
    if not isinstance(group, ProcessGroup):
        raise TypeError(
            f"group: expected a ProcessGroup, a group name or None, got {type(group).__name__}"
        )
    return group.group_name


def _device_type(device) -> str:
    """'cpu' or 'cuda' for init's/transport()'s ``device`` (None: cuda when available)."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"device: expected a str, a torch.device or None, got {type(device).__name__}"
        )
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"device: expected 'cpu' or 'cuda' (optionally with an index), got {device!r}"
        ) from None
    if dev.type not in TRANSPORTS:
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {str(dev)!r}")
    return dev.type


def _check_transport(transport, device_type: str) -> str:
    if not isinstance(transport, str):
        raise TypeError(f"transport: expected a str, got {type(transport).__name__}")
    allowed = TRANSPORTS[device_type]
    if transport not in allowed:
        known = sorted({t for ts in TRANSPORTS.values() for t in ts})
        if transport in known:
            raise ValueError(
                f"transport: {transport!r} does not serve {device_type} tensors; for "
                f"device {device_type!r} use one of {', '.join(map(repr, allowed))}"
            )
        raise ValueError(
            f"transport: expected one of {', '.join(map(repr, allowed))} for device "
            f"{device_type!r}, got {transport!r}"
        )
    return transport


def _check_timeout(timeout) -> float | None:
    """``timeout`` (seconds or a timedelta) in seconds, or None."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"timeout: expected seconds or a timedelta, got {type(timeout).__name__}")
    if not 0 < seconds < float("inf"):
        raise ValueError(f"timeout: expected a positive, finite duration, got {timeout!r}")
    return seconds


@dataclass(frozen=True)
class TransportConfig:
    """How :func:`init` sets up a group's transport; every field None takes the default.

    ``timeout``: seconds (or a timedelta) an shm op or a symm kernel waits for a peer before it
    fails (default: the process group's own timeout). ``half_bytes`` and ``mailbox_slot_bytes``:
    the symm transport's buffer sizes, per rank (``device="cuda"`` only): each of the two halves a
    sharded boundary or a collective exchanges through (default 192 MiB: a sharded boundary of
    8192 tokens at H = 7168), and each rank's slot of a Lamport mailbox (default: 16 tokens at
    H = 8192). A call that does not fit goes to the group's NCCL communicator.
    """

    timeout: float | timedelta | None = None
    half_bytes: int | None = None
    mailbox_slot_bytes: int | None = None

    def __post_init__(self):
        _check_timeout(self.timeout)
        _symm.check_sizes(self.half_bytes, self.mailbox_slot_bytes)

    def sizes_set(self) -> bool:
        return self.half_bytes is not None or self.mailbox_slot_bytes is not None


def _check_config(config, timeout) -> TransportConfig:
    """init's ``config`` (or one made of ``timeout``), checked, its timeout in seconds."""
    if config is None:
        return TransportConfig(timeout=timeout)
    if not isinstance(config, TransportConfig):
        raise TypeError(
            f"config: expected a mhc_sp.distributed.TransportConfig or None, got "
            f"{type(config).__name__}"
        )
    if timeout is not None:
        raise ValueError("timeout: given both as timeout= and in config; give it once")
    return replace(config, timeout=_check_timeout(config.timeout))


def group_timeout(pg: ProcessGroup) -> timedelta:
    """``pg``'s own timeout (what its collectives wait before failing). Groups made from it with
    ``dist.new_group`` get torch's default (30 minutes) unless given this one."""
    return timedelta(seconds=_timeout_seconds(pg, None))


def _timeout_seconds(pg: ProcessGroup, timeout: float | None) -> float:
    """``timeout`` or else the process group's own timeout."""
    if timeout is not None:
        return timeout
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except Exception:  # no CPU backend, or a torch without these attributes
        return dist.default_pg_timeout.total_seconds()


def hosts(group: GroupLike = None) -> tuple[list[int], list[str]]:
    """Which ranks of ``group`` (None = WORLD) share a host; collective over the group.

    Two ranks share a host when they run on the same kernel boot, in the same PID namespace, and
    each reads a shared-memory segment the other has just made (:mod:`mhc_sp.transports.hosts`).

    Returns ``(host, why)``: ``host[r]`` numbers rank r's host (rank 0's is 0, the others in the
    order their first rank appears) and ``why[r]`` says why rank r is not on rank 0's host ("" when
    it is).
    """
    pg = dist.group.WORLD if group is None else group
    if isinstance(pg, str):
        pg = resolve(pg)
    return _hosts.hosts(pg)


def init(
    group: GroupLike = None,
    device: torch.device | str | None = None,
    transport: str = "auto",
    timeout: float | timedelta | None = None,
    config: TransportConfig | None = None,
) -> str:
    """Register ``group`` (None = WORLD) with mhc_sp on this rank; collective over the group.

    ``device``: where the ops will run, ``"cpu"`` or ``"cuda"`` (default: cuda when available).
    ``transport``: for cpu ``"auto"`` (shm when every rank is on this host, else gloo), ``"shm"``
    or ``"gloo"``; for cuda ``"auto"`` (symm when every rank can map every other rank's GPU
    memory, else nccl), ``"symm"`` or ``"nccl"``. ``config``: a :class:`TransportConfig` (the
    timeout a peer is waited for, the symm buffer sizes); ``timeout=`` alone is the same as
    ``config=TransportConfig(timeout=...)``. Calling ``init`` again (on every rank) replaces the
    group's transport for that device. Returns the group's name, for the ops' ``group`` argument.
    """
    device_type = _device_type(device)
    transport = _check_transport(transport, device_type)
    timeout = _check_timeout(timeout)
    config = _check_config(config, timeout)
    if device_type == "cpu" and config.sizes_set():
        raise ValueError(
            "config: half_bytes and mailbox_slot_bytes size the symm transport's buffers "
            "(device='cuda'); the cpu transports size themselves"
        )
    if not dist.is_initialized():
        if group not in (None, WORLD):
            raise ValueError(f"group: {group!r} given but torch.distributed is not initialised")
        _C.register_group(WORLD, 0, 1)
        return WORLD
    pg = dist.group.WORLD if group is None else group
    if isinstance(pg, str):
        pg = resolve(pg)
    if not isinstance(pg, ProcessGroup):
        raise TypeError(
            f"group: expected a ProcessGroup, a group name or None, got {type(pg).__name__}"
        )
    name = pg.group_name
    rank, world = dist.get_rank(pg), pg.size()
    _C.register_group(name, rank, world)
    if world > 1:
        setup = transports.Group(
            pg,
            name,
            rank,
            world,
            device_type,
            device=device,
            timeout_s=_timeout_seconds(pg, config.timeout),
            half_bytes=config.half_bytes,
            mailbox_slot_bytes=config.mailbox_slot_bytes,
        )
        transports.set_up(setup, transport)  # the family's table: mhc_sp.transports
    return name


class Transport(str):
    """A transport's name (equal to the plain string), with ``reason``: why ``init`` chose it
    (None where that is not known)."""

    reason: str | None = None


def transport(group: GroupLike = None, device: torch.device | str | None = None) -> str | None:
    """The transport ``group`` uses for tensors on ``device`` (default: cuda when available):
    ``"shm"``, ``"gloo"``, ``"symm"``, ``"nccl"``, ``"local"`` for a world of one, or None when
    ``init`` set none up for that device. The name is a :class:`Transport`: its ``reason`` says
    why ``init`` chose it (which ranks are on another host, which GPUs lack peer access or native
    atomics), where that is known."""
    name, device_type = group_name(group), _device_type(device)
    chosen = _C.group_transport(name, device_type)
    if not chosen:
        return None
    out = Transport(chosen)
    out.reason = _choice.reason(name, device_type)
    return out


def destroy() -> None:
    """Free every communicator and workspace and forget every group registered with :func:`init`.

    NCCL communicators (the ``"nccl"`` transport's, and the one a symm group keeps) are destroyed,
    or aborted after a failure; a communicator an op is still using goes when that op is done.
    Also runs at interpreter exit (an :mod:`atexit` hook), while the CUDA runtime is certainly
    alive; processes that end without exit hooks (``os._exit``, multiprocessing's fork and
    forkserver children) should call it themselves, as ``mhc_sp.local_world`` does."""
    _C.unregister_all_groups()
    _choice.forget()


# Registered when this module is first imported, which is after torch's own import: hooks run in
# reverse order, so this one runs before torch's.
atexit.register(destroy)


def resolve(group: str) -> ProcessGroup:
    """The torch.distributed group registered under the name ``group``."""
    if not isinstance(group, str):
        raise TypeError(f"group: expected a group name (str), got {type(group).__name__}")
    if not dist.is_initialized():
        raise ValueError(f"group: unknown group {group!r}: torch.distributed is not initialised")
    try:
        return dist.distributed_c10d._resolve_process_group(group)
    except Exception:  # torch raises RuntimeError/KeyError depending on version
        raise ValueError(f"group: unknown torch.distributed group {group!r}") from None


def rank_and_world(group: GroupLike = None) -> tuple[int, int]:
    """(rank, world size) of a group registered with :func:`init`."""
    return tuple(_C.group_rank_world(group_name(group)))


def world_size_of(group: str) -> int:
    return rank_and_world(group)[1]
