# SPDX-License-Identifier: Apache-2.0
"""The CUDA ``symm`` transport: a buffer per rank from torch symmetric memory that every rank maps
(csrc/transport/symm/); ``"auto"`` prefers it to nccl wherever it can serve.

Every rank allocates one buffer through torch symmetric memory, the group rendezvouses once (host
blocking, never captured), and the C++ side gets the peer pointer table, initialises this rank's
buffer (flags at epoch 0, armed Lamport mailboxes, the segment header) and keeps an NCCL
communicator for calls that do not fit the buffer. The kernels see only the pointer table
(csrc/transport/symm/layout.h has the layout and the rules).

The pointer table. ``symm_mem.empty`` may sub-allocate the buffer from a larger segment, and the
handle's ``buffer_ptrs`` are the peers' segment bases as mapped here, not their buffers: rank p's
buffer sits at ``buffer_ptrs[p]`` plus p's offset inside its segment, which every rank measures on
its own buffer and the group exchanges (:func:`peer_table`).

"auto" picks symm when every rank of the group runs on this host (:func:`mhc_sp.distributed.hosts`,
the one test of a shared host) and every pair of the group's GPUs can access each other's memory
with native atomics (NVLink; PCIe peers lack the system-scope
atomics the kernels use to break a workspace), NCCL otherwise. Ranks that share a GPU count as
reachable only when torch's own switch for it, ``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1``, is
set (tests run two ranks on one GPU so); such a group keeps no NCCL communicator, which NCCL
refuses for ranks on one GPU. This module finds each rank's peer problems (:func:`peer_problems`)
and gathers every rank's (:func:`unusable`), so that every rank decides alike
(:func:`mhc_sp.transports.choice.choose`) and a group never mixes transports.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from .. import _C
from . import nccl
from .choice import Unusable
from .group import Group

# The buffer and the rendezvous handle that keeps the peers' buffers mapped belong to the group's
# C++ workspace, which releases them when the group's transport goes (mhc_sp.distributed.destroy
# or a new init): nothing of a group is kept here.

NAME = "symm"
DEVICE = "cuda"

_CONSTANTS = _C.symm_constants()
#: The most ranks a symm group takes.
MAX_WORLD: int = _CONSTANTS["max_world"]
DEFAULT_MAILBOX_SLOT_BYTES: int = _CONSTANTS["default_mailbox_slot_bytes"]
DEFAULT_HALF_BYTES: int = _CONSTANTS["default_half_bytes"]
SHARED_GPU_SWITCH = "TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"


def shared_gpus_allowed() -> bool:
    return os.environ.get(SHARED_GPU_SWITCH) == "1"


def cuda_link_problem(device: int, peer: int) -> str | None:
    """Why a kernel on GPU ``device`` cannot use GPU ``peer``'s memory as symm needs (peer
    access with native atomics), or None."""
    link = _C.cuda_peer_link(device, peer)
    if not link["access"]:
        return f"GPU {device} has no peer access to GPU {peer}"
    if not link["native_atomics"]:
        return (
            f"GPU {device} reaches GPU {peer} without native atomics (a PCIe link; symm needs "
            "system-scope atomics on peer memory)"
        )
    return None


def peer_problems(
    rank: int,
    hosts: Sequence,
    devices: Sequence[int],
    link_problem: Callable[[int, int], str | None],
    shared_gpus: bool = False,
) -> dict[int, str]:
    """The peers whose GPU memory ``rank`` cannot use, each with the reason: on another host, on
    the same GPU (unless ``shared_gpus``), or what ``link_problem(mine, theirs)`` says."""
    if len(hosts) != len(devices):
        raise ValueError(f"hosts: expected one entry per rank ({len(devices)}), got {len(hosts)}")
    if not 0 <= rank < len(devices):
        raise ValueError(f"rank: expected a value in [0, {len(devices)}), got {rank}")
    mine = devices[rank]
    problems = {}
    for p in range(len(devices)):
        if p == rank:
            continue
        if hosts[p] != hosts[rank]:
            problems[p] = "it runs on another host"
        elif devices[p] == mine:
            if not shared_gpus:
                problems[p] = f"it shares GPU {mine} (set {SHARED_GPU_SWITCH}=1 to allow that)"
        else:
            problem = link_problem(mine, devices[p])
            if problem:
                problems[p] = problem
    return problems


def peer_table(bases: Sequence[int], offsets: Sequence[int]) -> list[int]:
    """Every rank's buffer as mapped here: rank p's segment base plus p's offset in it."""
    if len(bases) != len(offsets):
        raise ValueError(f"offsets: expected one per rank ({len(bases)}), got {len(offsets)}")
    return [int(b) + int(o) for b, o in zip(bases, offsets)]


def buffer_offset(buffer_ptr: int, base: int, nbytes: int, segment_bytes: int | None) -> int:
    """This rank's buffer's offset in its own segment (``base``: its own entry of buffer_ptrs);
    ValueError when the buffer does not lie inside the segment."""
    offset = int(buffer_ptr) - int(base)
    if offset < 0 or (segment_bytes is not None and offset + nbytes > segment_bytes):
        raise ValueError(
            f"buffer: the symmetric buffer at 0x{buffer_ptr:x} ({nbytes} bytes) is not inside "
            f"its rendezvous segment at 0x{base:x} ({segment_bytes} bytes)"
        )
    return offset


def _check_bytes(value, name: str, default: int, minimum: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: expected an int number of bytes, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected at least {minimum} bytes, got {value}")
    return value


def check_sizes(half_bytes, mailbox_slot_bytes) -> tuple[int, int]:
    """(half_bytes, mailbox_slot_bytes) with the defaults for None; TypeError/ValueError naming a
    bad one."""
    half = _check_bytes(half_bytes, "half_bytes", DEFAULT_HALF_BYTES, 4096)
    slot = _check_bytes(mailbox_slot_bytes, "mailbox_slot_bytes", DEFAULT_MAILBOX_SLOT_BYTES, 16)
    return half, slot


def check_build() -> None:
    """ValueError unless this build and machine can run the symm transport (and the NCCL
    communicator it keeps)."""
    nccl.check_build()
    if not hasattr(_C, "init_symm_transport"):
        raise ValueError("device: CUDA transports need a CUDA build of mhc_sp and a visible GPU")


def every_ranks_peer_problems(group: Group) -> list[dict[int, str]]:
    """For every rank, the peers whose GPU memory it cannot use, each with why (the same list on
    every rank); fills ``group.devices``. Collective."""
    group.devices = group.gather(group.cuda_index())
    mine = peer_problems(
        group.rank, group.hosts()[0], group.devices, cuda_link_problem, shared_gpus_allowed()
    )
    return group.gather(mine)


def unusable(group: Group) -> Unusable | None:
    """More ranks than :data:`MAX_WORLD`, or a rank that cannot use a peer's GPU memory (the
    lowest such pair is named)."""
    if group.world > MAX_WORLD:
        return Unusable(
            f"symm takes at most {MAX_WORLD} ranks",
            f"transport: 'symm' takes at most {MAX_WORLD} ranks, group {group.name!r} has "
            f"{group.world}",
        )
    problems = every_ranks_peer_problems(group)
    pairs = [(r, p, why) for r, peers in enumerate(problems) for p, why in sorted(peers.items())]
    if not pairs:
        return None
    r, p, why = pairs[0]
    return Unusable(
        f"rank {r} cannot use rank {p}'s GPU memory: {why}",
        f"transport: 'symm' needs every rank of group {group.name!r} to map every other "
        f"rank's GPU memory (one host, peer access with native atomics); rank {r} cannot "
        f"use rank {p}'s: {why} (use 'nccl' or 'auto')",
    )


def reason(requested: str, group: Group, unusable: dict) -> str:
    fact = "every rank maps every other rank's GPU memory with native atomics"
    return fact if requested == "auto" else f"requested; {fact}"


def setup(group: Group) -> None:
    """Allocate, rendezvous and initialise this rank's buffer; collective. Runs after
    :func:`unusable` found every rank able to use every other's memory (``group.devices``)."""
    half, slot = check_sizes(group.half_bytes, group.mailbox_slot_bytes)
    name, rank, world, index = group.name, group.rank, group.world, group.cuda_index()
    # NCCL refuses ranks on one GPU: such a symm group keeps no NCCL communicator.
    uid = nccl.unique_id(group, needed=len(set(group.devices)) == world)
    from torch.distributed import _symmetric_memory as symm_mem

    layout = _C.symm_buffer_layout(world, slot, half)
    nbytes = layout["total_bytes"]
    buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", index))
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:  # required by older torch, a deprecated no-op in newer ones
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enable(name)
    handle = symm_mem.rendezvous(buffer, name)
    bases = [int(p) for p in handle.buffer_ptrs]
    segment = getattr(handle, "buffer_size", None)
    try:  # every rank learns every offset, or every rank raises the same error
        mine = (buffer_offset(buffer.data_ptr(), bases[rank], nbytes, segment), None)
    except ValueError as e:
        mine = (None, str(e))
    offsets = group.gather(mine)
    failed = [(r, err) for r, (_, err) in enumerate(offsets) if err is not None]
    if failed:
        r, err = failed[0]
        raise ValueError(f"{err} (rank {r} of group {name!r})")
    ptrs = peer_table(bases, [o for o, _ in offsets])
    # The workspace keeps the buffer and the handle (the peers' mappings) for as long as it lives.
    _C.init_symm_transport(
        name, uid, index, buffer, ptrs, slot, half, float(group.timeout_s), handle
    )
    dist.barrier(group=group.pg)  # every buffer is initialised before any rank's first push
