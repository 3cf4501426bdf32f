# SPDX-License-Identifier: Apache-2.0
"""Setup of the CUDA ``symm`` transport (used by :func:`mhc_sp.distributed.init`).

Every rank allocates one buffer through torch symmetric memory, the group rendezvouses once (host
blocking, never captured), and the C++ side gets the peer pointer table, initialises this rank's
buffer (flags at epoch 0, armed Lamport mailboxes, the segment header) and keeps an NCCL
communicator for calls that do not fit the buffer. The kernels see only the pointer table
(csrc/include/mhc_sp/symm.h has the layout and the rules).

"auto" picks symm when every rank of the group runs on this host and every pair of the group's
GPUs can access each other's memory (CUDA peer access: NVLink or PCIe P2P), NCCL otherwise. All
ranks decide together, so a group never mixes transports.
"""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from . import _C

#: Buffers and rendezvous handles per group name: the peers' mappings live as long as these do.
_BUFFERS: dict[str, tuple] = {}

_CONSTANTS = _C.symm_constants()
DEFAULT_MAILBOX_SLOT_BYTES: int = _CONSTANTS["default_mailbox_slot_bytes"]
DEFAULT_HALF_BYTES: int = _CONSTANTS["default_half_bytes"]


def _host_key() -> tuple:
    """Ranks with equal keys run on one machine (one kernel boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return (socket.gethostname(), f.read().strip())
    except OSError:  # not Linux: never assume a shared host
        return (socket.gethostname(), os.getpid())


def unreachable_peers(
    rank: int, hosts: Sequence, devices: Sequence[int], can_access: Callable[[int, int], bool]
) -> list[int]:
    """Ranks whose GPU memory ``rank`` cannot map: on another host, on the same GPU, or without
    peer access from ``devices[rank]``."""
    if len(hosts) != len(devices):
        raise ValueError(f"hosts: expected one entry per rank ({len(devices)}), got {len(hosts)}")
    if not 0 <= rank < len(devices):
        raise ValueError(f"rank: expected a value in [0, {len(devices)}), got {rank}")
    mine = devices[rank]
    return [
        p
        for p in range(len(devices))
        if p != rank
        and (hosts[p] != hosts[rank] or devices[p] == mine or not can_access(mine, devices[p]))
    ]


def choose(transport: str, unreachable: Sequence[Sequence[int]], name: str) -> str:
    """'symm' or 'nccl' for ``transport`` given every rank's unreachable peers (the same on all
    ranks). 'symm' where some rank cannot reach a peer is an error."""
    if transport not in ("auto", "symm", "nccl"):
        raise ValueError(
            f"transport: expected 'auto', 'symm' or 'nccl' for cuda, got {transport!r}"
        )
    pairs = [(r, p) for r, peers in enumerate(unreachable) for p in peers]
    if transport == "symm" and pairs:
        r, p = pairs[0]
        raise ValueError(
            f"transport: 'symm' needs every rank of group {name!r} to map every other "
            f"rank's GPU memory (one host, peer access); rank {r} cannot reach rank "
            f"{p} (use 'nccl' or 'auto')"
        )
    if transport == "nccl" or pairs:
        return "nccl"
    return "symm"


def _check_bytes(value, name: str, default: int, minimum: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: expected an int number of bytes, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected at least {minimum} bytes, got {value}")
    return value


def init(
    pg: ProcessGroup,
    name: str,
    rank: int,
    world: int,
    index: int,
    transport: str,
    timeout_s: float,
    half_bytes: int | None = None,
    mailbox_slot_bytes: int | None = None,
) -> str:
    """Set up the group's CUDA transport on device ``index``; collective. Returns the transport
    chosen ('symm' or 'nccl')."""
    if not torch.cuda.is_available() or not hasattr(_C, "init_symm_transport"):
        raise ValueError("device: CUDA transports need a CUDA build of mhc_sp and a visible GPU")
    half = _check_bytes(half_bytes, "half_bytes", DEFAULT_HALF_BYTES, 4096)
    slot = _check_bytes(mailbox_slot_bytes, "mailbox_slot_bytes", DEFAULT_MAILBOX_SLOT_BYTES, 16)
    if world > _CONSTANTS["max_world"] and transport == "symm":
        raise ValueError(
            f"transport: 'symm' takes at most {_CONSTANTS['max_world']} ranks, group "
            f"{name!r} has {world}"
        )
    chosen = "nccl"
    if transport != "nccl" and world <= _CONSTANTS["max_world"]:
        info = [None] * world
        dist.all_gather_object(info, (_host_key(), index), group=pg)
        hosts, devices = [i[0] for i in info], [i[1] for i in info]
        mine = unreachable_peers(rank, hosts, devices, torch.cuda.can_device_access_peer)
        every = [None] * world
        dist.all_gather_object(every, mine, group=pg)
        chosen = choose(transport, every, name)
    uid = [_C.nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, group=pg, group_src=0)
    if chosen == "nccl":
        dist.barrier(group=pg)  # every rank is here: the blocking NCCL init cannot wait forever
        _C.init_nccl_communicator(name, uid[0], index)
        return chosen
    from torch.distributed import _symmetric_memory as symm_mem

    layout = _C.symm_buffer_layout(world, slot, half)
    device = torch.device("cuda", index)
    buffer = symm_mem.empty(layout["total_bytes"], dtype=torch.uint8, device=device)
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:  # required by older torch, a deprecated no-op in newer ones
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enable(name)
    handle = symm_mem.rendezvous(buffer, name)
    ptrs = [int(p) for p in handle.buffer_ptrs]
    _C.init_symm_transport(name, uid[0], index, buffer, ptrs, slot, half, float(timeout_s))
    _BUFFERS[name] = (buffer, handle)
    dist.barrier(group=pg)  # every buffer is initialised before any rank's first push into it
    return chosen


def release(name: str | None = None) -> None:
    """Drop this process's references to the group's buffer (all groups when None)."""
    if name is None:
        _BUFFERS.clear()
    else:
        _BUFFERS.pop(name, None)
