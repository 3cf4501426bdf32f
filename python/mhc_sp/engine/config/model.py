# SPDX-License-Identifier: Apache-2.0
"""Dimensions of the lightweight DeepSeek-V4-style model (``ModelConfig``) and its presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from ...config import MhcConfig
from ._checks import check_non_negative_int, check_positive_int


@dataclass(frozen=True)
class ModelConfig:
    """Dimensions of the lightweight DeepSeek-V4-style model (docs/design.md §3).

    Attention is a plain causal multi-head stand-in with ``head_dim = hidden_size / num_heads``.
    The MoE has ``num_routed_experts`` experts (top ``num_experts_per_tok``) of intermediate size
    ``moe_intermediate_size`` plus ``num_shared_experts`` shared experts of the same size, fused
    into one shared MLP. ``num_mtp_layers`` is 0 or 1 (one MTP draft layer). ``seed`` seeds the
    synthetic weights.
    """

    vocab_size: int = 240
    hidden_size: int = 96
    num_layers: int = 2
    num_heads: int = 12
    num_routed_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 48
    num_shared_experts: int = 1
    routed_scaling_factor: float = 1.0
    capacity_factor: float = 1.25  # only used by the "capacity" MoE backend
    num_mtp_layers: int = 1
    mhc: MhcConfig = MhcConfig()
    seed: int = 0

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_routed_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
        ):
            check_positive_int(getattr(self, name), name)
        check_non_negative_int(self.num_shared_experts, "num_shared_experts")
        check_non_negative_int(self.seed, "seed")
        if self.num_mtp_layers not in (0, 1):
            raise ValueError(f"num_mtp_layers must be 0 or 1, got {self.num_mtp_layers!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}"
            )
        if self.num_experts_per_tok > self.num_routed_experts:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} must be <= "
                f"num_routed_experts={self.num_routed_experts}"
            )
        if not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor must be positive, got {self.capacity_factor!r}")
        if not isinstance(self.mhc, MhcConfig):
            raise TypeError(f"mhc: expected an MhcConfig, got {type(self.mhc).__name__}")

    @property
    def head_dim(self) -> int:
        """Attention head width: hidden_size / num_heads."""
        return self.hidden_size // self.num_heads

    @property
    def shared_intermediate_size(self) -> int:
        """Intermediate size of the fused shared-expert MLP (0: no shared expert)."""
        return self.num_shared_experts * self.moe_intermediate_size

    @classmethod
    def tiny(cls, **changes) -> "ModelConfig":
        """Test preset: hidden 96, 12 heads (tp 1, 2, 3, 4 all divide it), 2 layers, 8 experts
        top-2, vocab 240, one MTP layer. Keyword arguments override fields."""
        return dataclasses.replace(cls(), **changes)

    @classmethod
    def v4_flash(cls, **changes) -> "ModelConfig":
        """DeepSeek-V4-Flash dimensions: hidden 4096, 64 heads, 43 layers, 256 routed experts
        top-6, one shared expert, one MTP layer. The expert intermediate size (2048) and vocab
        (129280) are the DeepSeek-V3-family values (an assumption of this stand-in). Hundreds of
        GB of weights: build the model with ``device="meta"`` unless you mean it."""
        base = cls(
            vocab_size=129280,
            hidden_size=4096,
            num_layers=43,
            num_heads=64,
            num_routed_experts=256,
            num_experts_per_tok=6,
            moe_intermediate_size=2048,
            num_shared_experts=1,
            routed_scaling_factor=1.5,
            num_mtp_layers=1,
        )
        return dataclasses.replace(base, **changes)

    @classmethod
    def preset(cls, name: str, **changes) -> "ModelConfig":
        """``"tiny"`` or ``"v4-flash"`` (also ``"v4_flash"``)."""
        presets = {"tiny": cls.tiny, "v4-flash": cls.v4_flash, "v4_flash": cls.v4_flash}
        if name not in presets:
            raise ValueError(f"preset: unknown preset {name!r}; expected one of {sorted(presets)}")
        return presets[name](**changes)

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], **changes) -> "ModelConfig":
        """Read a Hugging Face DeepSeek-V4 ``config.json`` dict: ``vocab_size``, ``hidden_size``,
        ``num_hidden_layers``, ``num_attention_heads``, ``n_routed_experts``,
        ``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts``,
        ``routed_scaling_factor``, ``num_nextn_predict_layers`` and the mHC keys of
        ``MhcConfig.from_hf_config``. Missing keys keep the ``tiny`` defaults; keyword arguments
        override the result."""
        if not isinstance(cfg, Mapping):
            raise TypeError(
                f"cfg: expected a mapping (a parsed config.json), got {type(cfg).__name__}"
            )
        keys = {
            "vocab_size": "vocab_size",
            "hidden_size": "hidden_size",
            "num_hidden_layers": "num_layers",
            "num_attention_heads": "num_heads",
            "n_routed_experts": "num_routed_experts",
            "num_experts_per_tok": "num_experts_per_tok",
            "moe_intermediate_size": "moe_intermediate_size",
            "n_shared_experts": "num_shared_experts",
            "num_nextn_predict_layers": "num_mtp_layers",
        }
        kw: dict[str, Any] = {
            ours: int(cfg[hf]) for hf, ours in keys.items() if cfg.get(hf) is not None
        }
        if cfg.get("routed_scaling_factor") is not None:
            kw["routed_scaling_factor"] = float(cfg["routed_scaling_factor"])
        if kw.get("num_mtp_layers", 0) > 1:
            kw["num_mtp_layers"] = 1  # this wrapper runs one draft layer
        kw["mhc"] = MhcConfig.from_hf_config(cfg)
        kw.update(changes)
        return cls(**kw)
