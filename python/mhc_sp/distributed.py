"""Process groups as seen by mhc_sp's ops: name resolution and world sizes."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed import ProcessGroup

GroupLike = ProcessGroup | str | None


def group_name(group: GroupLike) -> str:
    """The name the ops take for ``group`` (None = WORLD)."""
    if isinstance(group, str):
        return group
    if not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised (call init_process_group first)")
    return (group or dist.group.WORLD).group_name


def resolve(group: str) -> ProcessGroup:
    """The torch.distributed group registered under ``group``; ValueError if there is none."""
    if not isinstance(group, str):
        raise TypeError(f"group: expected a group name (str), got {type(group).__name__}")
    if not dist.is_initialized():
        raise ValueError(f"group: unknown group {group!r}: torch.distributed is not initialised")
    try:
        return dist.distributed_c10d._resolve_process_group(group)
    except Exception as e:  # torch raises RuntimeError/KeyError depending on version
        raise ValueError(f"group: unknown group {group!r} ({e})") from None


def world_size_of(group: str) -> int:
    return resolve(group).size()
