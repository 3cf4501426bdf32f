# SPDX-License-Identifier: Apache-2.0
"""The transports :func:`mhc_sp.distributed.init` can give a group, one module each, as in
csrc/transport/: ``shm`` and ``gloo`` for CPU tensors, ``symm`` and ``nccl`` for CUDA tensors.

Each module names itself (``NAME``) and its device family (``DEVICE``), says whether it can serve
a group (``unusable``, absent where it serves every group) and why it was picked (``reason``),
may check the build first (``check_build``), and sets itself up (``setup``, collective). The
choice between them is :mod:`.choice`'s, the same for every family; :data:`TABLE` is the one list
of them. A new transport is a new module and one entry in :data:`TABLE` (and its C++ folder).
"""

from __future__ import annotations

from types import ModuleType

from . import choice, gloo, nccl, shm, symm
from .group import Group

#: Every transport. Within a device family, the order ``"auto"`` prefers them; the last of each
#: family serves every group.
TABLE: tuple[ModuleType, ...] = (shm, gloo, symm, nccl)

#: Each device family's transports by name, in the order ``"auto"`` prefers them.
PREFERENCE: dict[str, tuple[str, ...]] = {}
for _t in TABLE:
    PREFERENCE[_t.DEVICE] = (*PREFERENCE.get(_t.DEVICE, ()), _t.NAME)
del _t


def family(device_type: str) -> tuple[ModuleType, ...]:
    """The transports of ``device_type``, in the order ``"auto"`` prefers them."""
    return tuple(t for t in TABLE if t.DEVICE == device_type)


def set_up(group: Group, requested: str) -> str:
    """Give ``group`` its transport for ``group.device_type``: check the build, choose (and keep
    why, :func:`.choice.reason`), set it up; collective. Returns the transport's name."""
    transports = family(group.device_type)
    for t in transports:
        check = getattr(t, "check_build", None)
        if check is not None:
            check()
    picked = choice.choose(transports, requested, group)
    choice.record(group.name, group.device_type, picked)
    next(t for t in transports if t.NAME == picked.transport).setup(group)
    return picked.transport


__all__ = ["Group", "PREFERENCE", "TABLE", "choice", "family", "set_up"]
