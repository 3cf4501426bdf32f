# SPDX-License-Identifier: Apache-2.0
"""The mHC hyper-parameters (``MhcConfig``): the constants every op takes.

Kept apart from the engine simulation's configuration (``mhc_sp.engine.config``), so that the op
API (``mhc_sp.ops``) imports nothing of the simulation."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping


@dataclass(frozen=True)
class MhcConfig:
    """mHC hyper-parameters; defaults are DeepSeek-V4's (docs/design.md §1)."""

    hc_mult: int = 4
    sinkhorn_iters: int = 20
    hc_pre_eps: float = 1e-6
    hc_sinkhorn_eps: float = 1e-6
    hc_post_mult: float = 2.0
    rms_eps: float = 1e-6
    norm_eps: float = 1e-6
    hc_eps: float = 1e-6  # hc_head's weight epsilon

    def __post_init__(self):
        if not isinstance(self.hc_mult, int) or not 1 <= self.hc_mult <= 8:
            raise ValueError(f"hc_mult must be an int in [1, 8], got {self.hc_mult!r}")
        if not isinstance(self.sinkhorn_iters, int) or self.sinkhorn_iters < 1:
            raise ValueError(f"sinkhorn_iters must be a positive int, got {self.sinkhorn_iters!r}")
        for f in ("rms_eps", "norm_eps"):
            if not getattr(self, f) > 0:
                raise ValueError(f"{f} must be positive, got {getattr(self, f)!r}")
        for f in ("hc_pre_eps", "hc_sinkhorn_eps", "hc_eps"):
            if not getattr(self, f) >= 0:
                raise ValueError(f"{f} must be >= 0, got {getattr(self, f)!r}")

    @property
    def mix_rows(self) -> int:
        """Rows of the mHC projection ``fn``: n pre + n post + n*n comb logits."""
        return self.hc_mult * (self.hc_mult + 2)

    def scalars(self) -> tuple:
        """The op schemas' scalar tail S, in order."""
        return (
            self.rms_eps,
            self.hc_pre_eps,
            self.hc_sinkhorn_eps,
            self.hc_post_mult,
            self.sinkhorn_iters,
            self.norm_eps,
        )

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> "MhcConfig":
        """Read a Hugging Face DeepSeek-V4 ``config.json`` dict (``hc_mult``, ``hc_sinkhorn_iters``,
        ``hc_eps``, ``rms_norm_eps``; ``hc_post_mult`` if present). Missing keys keep the
        defaults."""
        kw: dict[str, Any] = {}
        if "hc_mult" in cfg:
            kw["hc_mult"] = int(cfg["hc_mult"])
        if "hc_sinkhorn_iters" in cfg:
            kw["sinkhorn_iters"] = int(cfg["hc_sinkhorn_iters"])
        if "hc_eps" in cfg:
            eps = float(cfg["hc_eps"])
            kw.update(hc_pre_eps=eps, hc_sinkhorn_eps=eps, hc_eps=eps)
        if "rms_norm_eps" in cfg:
            eps = float(cfg["rms_norm_eps"])
            kw.update(rms_eps=eps, norm_eps=eps)
        if "hc_post_mult" in cfg:
            kw["hc_post_mult"] = float(cfg["hc_post_mult"])
        return cls(**kw)

    def replace(self, **changes) -> "MhcConfig":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return MhcConfig(**values)
