# SPDX-License-Identifier: Apache-2.0
"""A group being set up (:class:`Group`): what :func:`mhc_sp.distributed.init` knows of it, and the
facts the transports' checks gather from every rank on demand (collectives, each once)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from . import hosts as _hosts


@dataclass
class Group:
    """One group's setup on this rank. ``device_type``: the family whose transport is set up;
    ``device``: init's ``device`` argument (a CUDA transport's device, None: the current one);
    ``timeout_s``: how long a peer is waited for; ``half_bytes``, ``mailbox_slot_bytes``: the symm
    buffer sizes (None: the defaults). ``host_facts`` and ``devices`` are filled when gathered
    (or given, by tests that stand in for the other ranks)."""

    pg: ProcessGroup | None
    name: str
    rank: int
    world: int
    device_type: str
    device: torch.device | str | None = None
    timeout_s: float = 0.0
    half_bytes: int | None = None
    mailbox_slot_bytes: int | None = None
    #: ``(host, why)`` of :func:`mhc_sp.transports.hosts.hosts`, once gathered.
    host_facts: tuple[list[int], list[str]] | None = None
    #: Every rank's CUDA device index, once gathered.
    devices: list[int] | None = None

    def hosts(self) -> tuple[list[int], list[str]]:
        """``(host, why)``: which ranks share a host; collective the first time."""
        if self.host_facts is None:
            self.host_facts = _hosts.hosts(self.pg)
        return self.host_facts

    def gather(self, value) -> list:
        """Every rank's ``value``, in rank order; collective."""
        out = [None] * self.world
        dist.all_gather_object(out, value, group=self.pg)
        return out

    def from_rank0(self, value):
        """Rank 0's ``value`` (the others pass None); collective."""
        box = [value]
        dist.broadcast_object_list(box, group=self.pg, group_src=0)
        return box[0]

    def cuda_index(self) -> int:
        """The CUDA device this rank's transport runs on."""
        dev = torch.device(self.device) if self.device is not None else torch.device("cuda")
        return dev.index if dev.index is not None else torch.cuda.current_device()
