# SPDX-License-Identifier: Apache-2.0
"""Tensor-parallel context and the per-tensor sharding helpers every weight goes through."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TPContext:
    """This rank's place in its tensor-parallel group. ``group`` is the mhc_sp group name the ops
    take (registered with ``mhc_sp.distributed.init`` on every rank of the group)."""

    rank: int = 0
    size: int = 1
    group: str = "0"

    def __post_init__(self):
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"size: expected a positive int, got {self.size!r}")
        if (
            isinstance(self.rank, bool)
            or not isinstance(self.rank, int)
            or not 0 <= self.rank < self.size
        ):
            raise ValueError(f"rank: expected an int in [0, {self.size}), got {self.rank!r}")
        if not isinstance(self.group, str):
            raise TypeError(f"group: expected a group name (str), got {type(self.group).__name__}")


def local_shape(
    full_shape: tuple[int, ...], shard_dim: int | None, tp_size: int
) -> tuple[int, ...]:
    """Shape of one rank's slice of a tensor of ``full_shape`` split evenly along ``shard_dim``."""
    if shard_dim is None:
        return tuple(full_shape)
    if full_shape[shard_dim] % tp_size:
        raise ValueError(
            f"full_shape: dim {shard_dim} of {tuple(full_shape)} is not divisible by "
            f"the tensor-parallel size {tp_size}"
        )
    shape = list(full_shape)
    shape[shard_dim] //= tp_size
    return tuple(shape)


def shard_index(
    full_shape: tuple[int, ...], shard_dim: int | None, rank: int, tp_size: int
) -> tuple[slice, ...]:
    """Index selecting ``rank``'s contiguous slice of a full tensor (all of it when not sharded).
    Every weight, synthetic or loaded, is sliced through this one function, which is why any tp
    reproduces the tp=1 model."""
    index = [slice(None)] * len(full_shape)
    if shard_dim is not None:
        step = full_shape[shard_dim] // tp_size
        index[shard_dim] = slice(rank * step, (rank + 1) * step)
    return tuple(index)


def make_param(
    full_shape: tuple[int, ...],
    shard_dim: int | None,
    tp: TPContext,
    dtype: torch.dtype,
    init: str,
    device: torch.device | str,
) -> torch.nn.Parameter:
    """An uninitialised (frozen) parameter holding this rank's slice of a ``full_shape`` tensor.

    The full shape, shard dim and synthetic init kind ride along as attributes so that
    ``mhc_sp.engine.model.weights`` can fill or load every parameter by name alone.
    """
    p = torch.nn.Parameter(
        torch.empty(local_shape(full_shape, shard_dim, tp.size), dtype=dtype, device=device),
        requires_grad=False,
    )
    p.full_shape = tuple(full_shape)
    p.shard_dim = shard_dim
    p.tp_rank = tp.rank
    p.tp_size = tp.size
    p.init_kind = init
    return p


def capturing(t: torch.Tensor) -> bool:
    """Whether ``t``'s device is capturing a CUDA graph right now (never true on CPU; the check
    is skipped there because it would initialise CUDA)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()
