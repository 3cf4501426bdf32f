# SPDX-License-Identifier: Apache-2.0
"""Pipeline and tensor-parallel groups, and the hand-off between pipeline stages
(docs/design.md §3).

A stage hands the next, as the engine does, the posted stream on the rows this rank holds:
``(rows, n, H)`` bf16, ``rows = ceil(P / tp)`` of the padded count ``P`` when sharded, else
``P``. The receiver allocates its buffer from the same plan the sender used, so no shape
travels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from ... import distributed as msd
from ..config import ModelConfig, ParallelConfig
from ..model import IntermediateTensors, TPContext, intermediate_shape
from .plan import ForwardPlan


@dataclass(frozen=True)
class ParallelGroups:
    """This rank's groups: TP (``tp.group`` registered with mhc_sp), its pipeline stage and the
    pipeline group (the ranks with the same TP rank, one per stage), and a one-rank group
    ``self_group`` (registered with mhc_sp) for running a tp=1 reference on this rank."""

    tp: TPContext
    pp_rank: int = 0
    pp_size: int = 1
    pp_group: Optional[dist.ProcessGroup] = None
    self_group: str = msd.WORLD

    @property
    def is_last_stage(self) -> bool:
        """This rank runs the last pipeline stage."""
        return self.pp_rank == self.pp_size - 1


def init_parallel_groups(
    parallel: ParallelConfig, device: torch.device | str = "cpu"
) -> ParallelGroups:
    """Create and register the TP and PP groups of ``parallel`` (collective: every rank calls it).

    Global rank = ``pp_rank * tp + tp_rank``. Without torch.distributed only tp = pp = 1 is
    possible (a world of one, group ``"0"``).
    """
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if not dist.is_initialized():
        if tp * pp != 1:
            raise ValueError(
                f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} needs "
                f"torch.distributed with {tp * pp} ranks; it is not initialised"
            )
        name = msd.init(None, device)
        return ParallelGroups(TPContext(0, 1, name), self_group=name)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != tp * pp:
        raise ValueError(
            f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} needs "
            f"{tp * pp} ranks, but the world has {world}"
        )
    pp_rank, tp_rank = divmod(rank, tp)
    # new_group is collective over WORLD: every rank creates every group, in the same order. The
    # groups wait as long as the world does (a lost peer fails them in the world's time).
    timeout = msd.group_timeout(dist.group.WORLD)
    tp_groups = [
        dist.new_group([p * tp + r for r in range(tp)], timeout=timeout) for p in range(pp)
    ]
    pp_groups = [
        dist.new_group([p * tp + r for p in range(pp)], timeout=timeout) for r in range(tp)
    ]
    self_groups = [dist.new_group([r], timeout=timeout) for r in range(world)]
    tp_name = msd.init(tp_groups[pp_rank], device)
    self_name = msd.init(self_groups[rank], device)
    return ParallelGroups(
        TPContext(tp_rank, tp, tp_name), pp_rank, pp, pp_groups[tp_rank], self_name
    )


def send_intermediate(groups: ParallelGroups, it: IntermediateTensors) -> None:
    """Send this stage's hand-off to the next stage's rank with the same TP rank."""
    dist.send(it.stream.contiguous(), group=groups.pp_group, group_dst=groups.pp_rank + 1)


def recv_intermediate(
    groups: ParallelGroups, cfg: ModelConfig, plan: ForwardPlan, device: torch.device
) -> IntermediateTensors:
    """Receive the previous stage's hand-off of a forward planned as ``plan``."""
    shape = intermediate_shape(cfg, plan.padded_tokens, groups.tp.size, plan.sharded)
    stream = torch.empty(shape, dtype=torch.bfloat16, device=device)
    dist.recv(stream, group=groups.pp_group, group_src=groups.pp_rank - 1)
    return IntermediateTensors(stream)
