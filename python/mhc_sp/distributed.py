"""Process groups for mhc_sp's collective and fused ops.

The ops take a group *name* (``pg.group_name``; ``"0"`` is WORLD). A group must be registered
with :func:`init` on every rank before ops use it:

* CPU tensors use the group's own gloo backend (a group created with backend ``"gloo"`` or
  ``"cpu:gloo,cuda:nccl"``).
* CUDA tensors use an NCCL communicator that ``init`` creates for the group (rank 0 makes the
  unique id, the group broadcasts it, every rank joins on its current CUDA device). Collectives
  are enqueued on the current CUDA stream.
* A world of one needs no communicator: ``init()`` without torch.distributed registers ``"0"``
  as a single-rank group, so single-GPU engines call the same ops.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from . import _C

GroupLike = ProcessGroup | str | None

#: Group name used for WORLD (and for the single-rank group registered without torch.distributed).
WORLD = "0"


def group_name(group: GroupLike) -> str:
    """The name the ops take for ``group`` (None = WORLD)."""
    if isinstance(group, str):
        return group
    if group is None and not dist.is_initialized():
        return WORLD
    if group is None:
        group = dist.group.WORLD
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group: expected a ProcessGroup, a group name or None, got {type(group).__name__}")
    return group.group_name


def init(group: GroupLike = None, device: torch.device | str | None = None) -> str:
    """Register ``group`` (None = WORLD) with mhc_sp on this rank; collective over the group.

    ``device``: where the ops will run. ``"cuda"`` (default when CUDA is available) also creates
    the group's NCCL communicator on the current CUDA device (or the given index). Returns the
    group's name, for the ops' ``group`` argument.
    """
    if not dist.is_initialized():
        if group not in (None, WORLD):
            raise ValueError(f"group: {group!r} given but torch.distributed is not initialised")
        _C.register_group(WORLD, 0, 1)
        return WORLD
    pg = dist.group.WORLD if group is None else group
    if isinstance(pg, str):
        pg = resolve(pg)
    name = pg.group_name
    rank, world = dist.get_rank(pg), pg.size()
    _C.register_group(name, rank, world)
    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if dev.type == "cuda" and world > 1:
        if not hasattr(_C, "init_nccl_communicator"):
            raise ValueError("device: mhc_sp was built without CUDA; it cannot create an NCCL communicator")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        uid = [_C.nccl_unique_id() if rank == 0 else None]
        dist.broadcast_object_list(uid, group=pg, group_src=0)
        dist.barrier(group=pg)  # every rank is here: the blocking NCCL init cannot wait forever
        _C.init_nccl_communicator(name, uid[0], index)
    return name


def destroy() -> None:
    """Free every communicator and forget every group registered with :func:`init`."""
    _C.unregister_all_groups()


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
