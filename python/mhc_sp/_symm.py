# SPDX-License-Identifier: Apache-2.0
"""Setup of the CUDA ``symm`` transport (used by :func:`mhc_sp.distributed.init`).

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
refuses for ranks on one GPU. This module finds each rank's peer problems (:func:`peer_problems`);
:func:`mhc_sp._transport_choice.choose_cuda` decides from them, on all ranks together, so a group
never mixes transports, and keeps why (``mhc_sp.distributed.transport(...).reason``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from . import _C, _transport_choice

# The buffer and the rendezvous handle that keeps the peers' buffers mapped belong to the group's
# C++ workspace, which releases them when the group's transport goes (mhc_sp.distributed.destroy
# or a new init): nothing of a group is kept here.

_CONSTANTS = _C.symm_constants()
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


def _gathered(pg: ProcessGroup, value, world: int) -> list:
    out = [None] * world
    dist.all_gather_object(out, value, group=pg)
    return out


def check_sizes(half_bytes, mailbox_slot_bytes) -> tuple[int, int]:
    """(half_bytes, mailbox_slot_bytes) with the defaults for None; TypeError/ValueError naming a
    bad one."""
    half = _check_bytes(half_bytes, "half_bytes", DEFAULT_HALF_BYTES, 4096)
    slot = _check_bytes(mailbox_slot_bytes, "mailbox_slot_bytes", DEFAULT_MAILBOX_SLOT_BYTES, 16)
    return half, slot


def init(
    pg: ProcessGroup,
    name: str,
    rank: int,
    world: int,
    index: int,
    transport: str,
    timeout_s: float,
    host: Sequence[int],
    half_bytes: int | None = None,
    mailbox_slot_bytes: int | None = None,
) -> str:
    """Set up the group's CUDA transport on device ``index``; collective. ``host[r]`` numbers rank
    r's host (:func:`mhc_sp.distributed.hosts`). Returns the transport chosen ('symm' or 'nccl');
    ``mhc_sp._transport_choice.reason(name, "cuda")`` says why."""
    if not torch.cuda.is_available() or not hasattr(_C, "init_symm_transport"):
        raise ValueError("device: CUDA transports need a CUDA build of mhc_sp and a visible GPU")
    half, slot = check_sizes(half_bytes, mailbox_slot_bytes)
    devices = [index] * world  # every rank's GPU, once the choice has needed them

    def every_ranks_peer_problems() -> list:
        nonlocal devices
        devices = _gathered(pg, index, world)
        mine = peer_problems(rank, host, devices, cuda_link_problem, shared_gpus_allowed())
        return _gathered(pg, mine, world)

    choice = _transport_choice.choose_cuda(
        transport, name, world, _CONSTANTS["max_world"], every_ranks_peer_problems
    )
    _transport_choice.record(name, "cuda", choice)
    chosen = choice.transport
    # NCCL refuses ranks on one GPU: such a symm group keeps no NCCL communicator.
    need_nccl = chosen == "nccl" or len(set(devices)) == world
    uid = [_C.nccl_unique_id() if rank == 0 and need_nccl else None]
    dist.broadcast_object_list(uid, group=pg, group_src=0)
    if chosen == "nccl":
        dist.barrier(group=pg)  # every rank is here: the blocking NCCL init cannot wait forever
        _C.init_nccl_communicator(name, uid[0], index)
        return chosen
    from torch.distributed import _symmetric_memory as symm_mem

    layout = _C.symm_buffer_layout(world, slot, half)
    nbytes = layout["total_bytes"]
    device = torch.device("cuda", index)
    buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
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
    offsets = _gathered(pg, mine, world)
    failed = [(r, err) for r, (_, err) in enumerate(offsets) if err is not None]
    if failed:
        r, err = failed[0]
        raise ValueError(f"{err} (rank {r} of group {name!r})")
    ptrs = peer_table(bases, [o for o, _ in offsets])
    # The workspace keeps the buffer and the handle (the peers' mappings) for as long as it lives.
    _C.init_symm_transport(name, uid[0], index, buffer, ptrs, slot, half, float(timeout_s), handle)
    dist.barrier(group=pg)  # every buffer is initialised before any rank's first push into it
    return chosen
