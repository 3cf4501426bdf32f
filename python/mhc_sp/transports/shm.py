# SPDX-License-Identifier: Apache-2.0
"""The CPU ``shm`` transport: one shared-memory segment per group, for ranks on one host
(csrc/transport/shm/; docs/transports.md). ``"auto"`` prefers it to gloo wherever it can serve.

Rank 0 names the segment, the group learns the name, and every rank maps it; a peer that dies or
stalls makes the ops raise within ``timeout_s``, naming the rank."""

from __future__ import annotations

from .. import _C
from .choice import Unusable
from .group import Group
from .hosts import describe

NAME = "shm"
DEVICE = "cpu"
#: Where the ranks run is gathered in every CPU setup: every CPU reason reports it.
ALWAYS_ASKED = True


def unusable(group: Group) -> Unusable | None:
    """Not every rank on rank 0's host (:func:`mhc_sp.distributed.hosts`)."""
    elsewhere, fact, detail = describe(*group.hosts())
    if not elsewhere:
        return None
    return Unusable(
        fact,
        f"transport: 'shm' needs every rank of group {group.name!r} on one host; ranks "
        f"{elsewhere} do not share rank 0's host (use 'gloo' or 'auto'): {detail}",
    )


def reason(requested: str, group: Group, unusable: dict) -> str:
    """Why a CPU transport was picked: where the ranks run."""
    return f"{requested!r} requested: {describe(*group.hosts())[1]}"


def setup(group: Group) -> None:
    segment = group.from_rank0(_C.new_shm_segment_name() if group.rank == 0 else None)
    _C.init_shm_transport(group.name, segment, group.timeout_s)
