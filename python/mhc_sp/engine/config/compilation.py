# SPDX-License-Identifier: Apache-2.0
"""The compile-pass settings of sequence parallelism (``PassConfig``), the engine's default for
its minimum token count, and CUDA graph sizes (``CompilationConfig``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ._checks import check_non_negative_int, check_positive_int

#: The engine's tables for the compile pass's default minimum, by CUDA compute capability
#: (``10 * major + minor``; every Blackwell variant counts as 100): the smallest hidden size the
#: pass is applied to, and the activation size per GPU, in MiB, from which it pays off.
SP_MIN_HIDDEN_SIZE = {90: 8192, 100: 8192}
SP_MIN_PER_GPU_SIZE_MB = {90: 8, 100: 32}


def sequence_parallelism_threshold(
    hidden_size: int, tp_size: int, element_size: int, device_capability: Optional[int]
) -> Optional[int]:
    """The engine's default ``sp_min_token_num``: ``(MiB per GPU * tp * 2**20) //
    (hidden_size * element_size)`` on a CUDA device of a listed capability with ``hidden_size``
    at least the listed minimum; None otherwise (``device_capability`` None: not CUDA), and then
    the pass is switched off."""
    if device_capability is None:
        return None
    capability = 100 if device_capability // 10 == 10 else device_capability
    min_hidden, per_gpu_mb = (
        SP_MIN_HIDDEN_SIZE.get(capability),
        SP_MIN_PER_GPU_SIZE_MB.get(capability),
    )
    if min_hidden is None or per_gpu_mb is None or hidden_size < min_hidden:
        return None
    return int(per_gpu_mb * 2**20 * tp_size // (hidden_size * element_size))


def cuda_device_capability() -> Optional[int]:
    """The current CUDA device's compute capability as ``10 * major + minor``; None without one
    (what the engine's platform reports when it derives the pass's default)."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return 10 * major + minor


@dataclass(frozen=True)
class PassConfig:
    """The compile-pass configuration of sequence parallelism.

    ``enable_sp``: None = the pass's default (off); True/False forces it. ``sp_min_token_num``:
    the smallest (padded) token count the pass rewrites for SP; None = the engine's default
    (:func:`sequence_parallelism_threshold`). ``EngineConfig`` switches the pass on from
    ``ParallelConfig.sp_threshold`` unless ``enforce_eager``, sets ``sp_min_token_num`` from it
    only when it is unset, and resolves the pass as the engine does (off with tp = 1 or when no
    default exists). These settings are the compile pass's alone: the model's in-forward SP
    (what the runner plans) follows ``sp_threshold``.
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
    ``1, 2, 4, 8, 16, 24, ...`` up to ``max_cudagraph_capture_size`` (0: no graphs;
    ``EngineConfig`` sets it to 0 under ``enforce_eager``, as the engine does)."""

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
