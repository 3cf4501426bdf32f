# SPDX-License-Identifier: Apache-2.0
"""The CUDA ``nccl`` transport: an NCCL communicator made for the group (rank 0 makes the unique
id, the group broadcasts it, every rank joins on its CUDA device); it serves every group, and
``"auto"`` takes it where symm cannot serve. The symm transport keeps one too, for the calls
that do not fit its buffers (:func:`unique_id`). csrc/transport/nccl/."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _C
from .group import Group

NAME = "nccl"
DEVICE = "cuda"


def check_build() -> None:
    """ValueError unless this build and machine can run a CUDA transport."""
    if not hasattr(_C, "init_nccl_communicator"):
        raise ValueError(
            "device: mhc_sp was built without CUDA; it cannot create an NCCL communicator"
        )
    if not torch.cuda.is_available():
        raise ValueError("device: CUDA transports need a CUDA build of mhc_sp and a visible GPU")


def reason(requested: str, group: Group, unusable: dict) -> str:
    """ "requested", or why the transports ``"auto"`` prefers could not serve."""
    return "requested" if requested == NAME else next(iter(unusable.values())).why


def unique_id(group: Group, needed: bool = True):
    """Rank 0's NCCL unique id, on every rank (None where not ``needed``); collective."""
    return group.from_rank0(_C.nccl_unique_id() if group.rank == 0 and needed else None)


def setup(group: Group) -> None:
    uid = unique_id(group)
    dist.barrier(group=group.pg)  # every rank is here: the blocking NCCL init cannot wait forever
    _C.init_nccl_communicator(group.name, uid, group.cuda_index())
