# SPDX-License-Identifier: Apache-2.0
"""A lightweight DeepSeek-V4-style model that drives the mhc_sp ops the way a serving engine does
(docs/design.md §3): TP attention and MoE returning un-reduced partials, fused mHC boundaries, an
MTP draft layer run as a forward of its own, synthetic or loaded weights sliced per TP rank."""

from .attention import CausalSelfAttention
from .layer import DeepseekV4DecoderLayer
from .linear import (
    ColumnParallelLinear,
    ParallelLMHead,
    ReplicatedLinear,
    RMSNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
    rms_norm,
)
from .mhc import HyperConnection, HyperHead, MhcStream
from .model import (
    DeepseekV4Model,
    DeepseekV4MTP,
    IntermediateTensors,
    ModelOutput,
    check_gathered_stream,
    intermediate_shape,
    pp_layer_range,
)
from .moe import MoE, RoutingTrace
from .parallel import TPContext
from .weights import LoadReport, init_synthetic, load_safetensors, synthetic_state_dict

__all__ = [
    "CausalSelfAttention",
    "ColumnParallelLinear",
    "DeepseekV4DecoderLayer",
    "DeepseekV4MTP",
    "DeepseekV4Model",
    "HyperConnection",
    "HyperHead",
    "IntermediateTensors",
    "LoadReport",
    "MhcStream",
    "MoE",
    "ModelOutput",
    "ParallelLMHead",
    "ReplicatedLinear",
    "RMSNorm",
    "RoutingTrace",
    "RowParallelLinear",
    "TPContext",
    "VocabParallelEmbedding",
    "check_gathered_stream",
    "init_synthetic",
    "intermediate_shape",
    "load_safetensors",
    "pp_layer_range",
    "rms_norm",
    "synthetic_state_dict",
]
