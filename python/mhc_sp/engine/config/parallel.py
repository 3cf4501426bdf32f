# SPDX-License-Identifier: Apache-2.0
"""Tensor, pipeline and sequence parallel sizes (``ParallelConfig``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ._checks import check_positive_int

#: The most tokens one forward can have: the engine's attention metadata indexes a batch's tokens
#: with int32 (``query_start_loc``), so a larger ``sp_threshold`` could never be reached.
MAX_NUM_TOKENS = 2**31 - 1


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor / pipeline parallel sizes and the sequence-parallel threshold.

    ``sp_threshold``: None = no SP; N in ``[1, MAX_NUM_TOKENS]`` = SP engages on forwards of at
    least N tokens, only with ``tensor_parallel_size > 1``. The model's in-forward SP reads this
    field itself, with or without ``enforce_eager`` (the compile pass's ``sp_min_token_num`` is
    the pass's own setting and never moves it).
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    sp_threshold: Optional[int] = None

    def __post_init__(self):
        check_positive_int(self.tensor_parallel_size, "tensor_parallel_size")
        check_positive_int(self.pipeline_parallel_size, "pipeline_parallel_size")
        if self.sp_threshold is not None:
            check_positive_int(self.sp_threshold, "sp_threshold")
            if self.sp_threshold > MAX_NUM_TOKENS:
                raise ValueError(
                    f"sp_threshold must be at most {MAX_NUM_TOKENS} (2**31 - 1, the most tokens "
                    f"a forward can have), got {self.sp_threshold}; use None to switch SP off"
                )

    @property
    def enable_sp(self) -> bool:
        """SP is configured: ``tp > 1`` and ``sp_threshold`` is set."""
        return self.tensor_parallel_size > 1 and self.sp_threshold is not None

    @property
    def sequence_parallel_size(self) -> int:
        """Ranks a token-sharded stream is split over: tp when SP is enabled, else 1."""
        return self.tensor_parallel_size if self.enable_sp else 1

    @property
    def world_size(self) -> int:
        """Ranks needed: tensor_parallel_size * pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size
