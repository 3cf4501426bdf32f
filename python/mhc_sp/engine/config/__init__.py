# SPDX-License-Identifier: Apache-2.0
"""The engine simulation's configuration, one module per concern (the mHC constants every op
takes, :class:`mhc_sp.config.MhcConfig`, live beside the ops, outside the simulation):

* ``model``: :class:`ModelConfig`, the dimensions of the DeepSeek-V4-style model;
* ``parallel``: :class:`ParallelConfig`, tensor / pipeline sizes and ``sp_threshold``;
* ``compilation``: :class:`PassConfig` and :class:`CompilationConfig`, the compile pass (with the
  engine's default minimum) and CUDA graph sizes;
* ``moe``: the MoE backends and which may run with sequence parallelism;
* ``engine``: :class:`EngineConfig`, all of them validated together;
* ``engine_args``: :class:`EngineArgs`, command-line flags to an ``EngineConfig``.
"""

from .compilation import CompilationConfig, PassConfig, sequence_parallelism_threshold
from .engine import EngineConfig
from .engine_args import EngineArgs
from .model import ModelConfig
from .moe import MOE_BACKEND_SUPPORTS_SP, check_moe_backend
from .parallel import MAX_NUM_TOKENS, ParallelConfig

__all__ = [
    "CompilationConfig",
    "EngineArgs",
    "EngineConfig",
    "MAX_NUM_TOKENS",
    "MOE_BACKEND_SUPPORTS_SP",
    "ModelConfig",
    "ParallelConfig",
    "PassConfig",
    "check_moe_backend",
    "sequence_parallelism_threshold",
]
