# SPDX-License-Identifier: Apache-2.0
"""The compile-pass settings of sequence parallelism (``PassConfig``) and CUDA graph sizes
(``CompilationConfig``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ._checks import check_non_negative_int, check_positive_int


@dataclass(frozen=True)
class PassConfig:
    """The compile-pass configuration of sequence parallelism.

    ``enable_sp``: None = the pass's default (off); True/False forces it. ``sp_min_token_num``:
    the smallest (padded) token count the pass rewrites for SP. ``EngineConfig`` switches the pass
    on from ``ParallelConfig.sp_threshold`` unless ``enforce_eager``, and sets
    ``sp_min_token_num`` from it only when it is unset. These settings are the compile pass's
    alone: the model's in-forward SP (what the runner plans) follows ``sp_threshold``.
    """

    enable_sp: Optional[bool] = None
    sp_min_token_num: Optional[int] = None

    def __post_init__(self):
        if self.enable_sp is not None and not isinstance(self.enable_sp, bool):
            raise ValueError(f"enable_sp must be None, True or False, got {self.enable_sp!r}")
        if self.sp_min_token_num is not None:
            check_positive_int(self.sp_min_token_num, "sp_min_token_num")


@dataclass(frozen=True)
class CompilationConfig:
    """Compile pass settings and CUDA graph sizes. Graphs are captured for padded batch sizes
    ``1, 2, 4, 8, 16, 24, ...`` up to ``max_cudagraph_capture_size`` (0: no graphs)."""

    pass_config: PassConfig = PassConfig()
    max_cudagraph_capture_size: int = 0

    def __post_init__(self):
        if not isinstance(self.pass_config, PassConfig):
            raise TypeError(
                f"pass_config: expected a PassConfig, got {type(self.pass_config).__name__}"
            )
        check_non_negative_int(self.max_cudagraph_capture_size, "max_cudagraph_capture_size")

    def cudagraph_capture_sizes(self) -> list[int]:
        """Batch sizes graphs are captured for, ascending; the last is the maximum."""
        top = self.max_cudagraph_capture_size
        if top == 0:
            return []
        sizes = sorted({s for s in (1, 2, 4) if s <= top} | set(range(8, top + 1, 8)) | {top})
        return sizes
