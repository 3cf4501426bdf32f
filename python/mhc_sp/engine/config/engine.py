# SPDX-License-Identifier: Apache-2.0
"""``EngineConfig``: the model, parallel and compilation settings of one engine, validated
together with the rules of sequence parallelism."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Optional

from ._checks import check_non_negative_int
from .compilation import (
    CompilationConfig,
    PassConfig,
    cuda_device_capability,
    sequence_parallelism_threshold,
)
from .model import ModelConfig
from .moe import check_moe_backend
from .parallel import ParallelConfig

#: Bytes of one activation element: the model computes in bfloat16.
BF16_BYTES = 2


@dataclass(frozen=True)
class EngineConfig:
    """Everything a runner needs, validated together; errors name the values.

    * Shapes that TP splits must divide by ``tensor_parallel_size``; every pipeline stage needs a
      layer.
    * ``enforce_eager`` captures nothing: ``max_cudagraph_capture_size`` becomes 0, as in the
      engine.
    * With SP enabled, ``sp_threshold <= max_cudagraph_capture_size`` is refused: SP must never
      engage on a captured size (never fires under ``enforce_eager``, whose capture size is 0).
    * When not ``enforce_eager`` and SP is enabled, the compile pass is switched on
      (``pass_config.enable_sp=True``) and given ``sp_min_token_num=sp_threshold`` unless it has
      one. The pass is then resolved as the engine resolves it: switched off with a warning at
      tp = 1; an unset ``sp_min_token_num`` takes the engine's default
      (``sequence_parallelism_threshold``), and where there is none the pass is switched off
      with a warning. The model's in-forward SP follows ``parallel.sp_threshold`` and engages
      only when ``parallel.enable_sp``, whatever the pass says.
    * A MoE backend that is not valid on a token shard is refused when ``parallel.enable_sp``.
    * ``num_speculative_tokens``: MTP draft steps per forward (0: none; needs an MTP layer).
    """

    model: ModelConfig = ModelConfig()
    parallel: ParallelConfig = ParallelConfig()
    compilation: CompilationConfig = CompilationConfig()
    enforce_eager: bool = False
    moe_backend: str = "naive"
    num_speculative_tokens: int = 0

    def __post_init__(self):
        for name, cls in (
            ("model", ModelConfig),
            ("parallel", ParallelConfig),
            ("compilation", CompilationConfig),
        ):
            value = getattr(self, name)
            if not isinstance(value, cls):
                raise TypeError(f"{name}: expected a {cls.__name__}, got {type(value).__name__}")
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {self.enforce_eager!r}")
        m, p = self.model, self.parallel
        tp, pp = p.tensor_parallel_size, p.pipeline_parallel_size

        for name, value in (
            ("num_heads", m.num_heads),
            ("moe_intermediate_size", m.moe_intermediate_size),
            ("shared_intermediate_size", m.shared_intermediate_size),
            ("vocab_size", m.vocab_size),
        ):
            if value % tp:
                raise ValueError(
                    f"model.{name}={value} must be divisible by tensor_parallel_size={tp}"
                )
        if m.num_layers < pp:
            raise ValueError(
                f"model.num_layers={m.num_layers} must be >= "
                f"pipeline_parallel_size={pp} (every stage needs a layer)"
            )

        if self.enforce_eager and self.compilation.max_cudagraph_capture_size:
            self._replace(
                compilation=dataclasses.replace(self.compilation, max_cudagraph_capture_size=0)
            )
        max_graph = self.compilation.max_cudagraph_capture_size
        if p.enable_sp and p.sp_threshold <= max_graph:
            raise ValueError(
                f"sp_threshold={p.sp_threshold} must be greater than "
                f"max_cudagraph_capture_size={max_graph} with "
                f"tensor_parallel_size={tp}: SP must never engage on a captured size"
            )
        self._resolve_pass_config()

        check_moe_backend(self.moe_backend, p.enable_sp)
        check_non_negative_int(self.num_speculative_tokens, "num_speculative_tokens")
        if self.num_speculative_tokens and not m.num_mtp_layers:
            raise ValueError(
                f"num_speculative_tokens={self.num_speculative_tokens} needs an MTP "
                f"layer (model.num_mtp_layers=0)"
            )

    def _replace(self, **changes) -> None:
        """Set fields of this frozen config while it is being validated."""
        for name, value in changes.items():
            object.__setattr__(self, name, value)

    def _resolve_pass_config(self) -> None:
        """Map ``sp_threshold`` into the compile pass (not under ``enforce_eager``), then resolve
        the pass as the engine does."""
        p, pc = self.parallel, self.compilation.pass_config
        if not self.enforce_eager and p.enable_sp:
            minimum = pc.sp_min_token_num if pc.sp_min_token_num is not None else p.sp_threshold
            pc = PassConfig(enable_sp=True, sp_min_token_num=minimum)
        if pc.enable_sp:
            tp = p.tensor_parallel_size
            if tp == 1:
                warnings.warn("Sequence Parallelism requires TP>1, disabling", stacklevel=4)
                pc = dataclasses.replace(pc, enable_sp=False)
            elif pc.sp_min_token_num is None:
                minimum = sequence_parallelism_threshold(
                    self.model.hidden_size, tp, BF16_BYTES, cuda_device_capability()
                )
                if minimum is None:
                    warnings.warn(
                        "Model hidden_size too small for the SP threshold heuristic, disabling. "
                        "To force SP, set pass_config.sp_min_token_num manually.",
                        stacklevel=4,
                    )
                pc = PassConfig(enable_sp=minimum is not None, sp_min_token_num=minimum)
        if pc != self.compilation.pass_config:
            self._replace(compilation=dataclasses.replace(self.compilation, pass_config=pc))

    @property
    def sp_threshold(self) -> Optional[int]:
        """The token count from which the model's in-forward SP engages: ``parallel.sp_threshold``
        when ``parallel.enable_sp``, else None (never). Independent of ``enforce_eager`` and of
        the compile pass's ``sp_min_token_num``."""
        return self.parallel.sp_threshold if self.parallel.enable_sp else None

    @property
    def use_cudagraphs(self) -> bool:
        """CUDA graphs are on (they are only used on CUDA devices; never under ``enforce_eager``,
        whose capture size is 0)."""
        return self.compilation.max_cudagraph_capture_size > 0
