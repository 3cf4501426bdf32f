# SPDX-License-Identifier: Apache-2.0
"""mHC parameters and the token-sharded residual stream the fused ops carry between sublayers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...config import MhcConfig
from .parallel import TPContext, make_param


@dataclass
class MhcStream:
    """The n-stream residual and the coefficients its pending ``mhc_post`` will use.

    Sharded: this rank's ``ceil(T / tp)`` rows (padding rows are zeros); not sharded: all T rows.
    ``residual (rows, n, H)`` bf16, ``post (rows, n)`` fp32, ``comb (rows, n, n)`` fp32.
    """

    residual: Tensor
    post: Tensor
    comb: Tensor

    def tensors(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(residual, post, comb)``, in the order the fused ops take them."""
        return self.residual, self.post, self.comb


class HyperConnection(nn.Module):
    """One sublayer's mHC ``pre`` parameters (replicated): ``fn (n(n+2), n*H)``, ``scale (3,)``,
    ``base (n(n+2),)``, all fp32."""

    def __init__(self, hidden: int, mhc: MhcConfig, tp: TPContext, device):
        super().__init__()
        n, M = mhc.hc_mult, mhc.mix_rows
        self.fn = make_param((M, n * hidden), None, tp, torch.float32, "hc_fn", device)
        self.scale = make_param((3,), None, tp, torch.float32, "hc_scale", device)
        self.base = make_param((M,), None, tp, torch.float32, "hc_base", device)

    def args(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(fn, scale, base)``, in the order the ops take them."""
        return self.fn, self.scale, self.base


class HyperHead(nn.Module):
    """The final collapse's parameters (``hc_head``): ``fn (n, n*H)``, ``scale (1,)``,
    ``base (n,)``."""

    def __init__(self, hidden: int, mhc: MhcConfig, tp: TPContext, device):
        super().__init__()
        n = mhc.hc_mult
        self.fn = make_param((n, n * hidden), None, tp, torch.float32, "hc_fn", device)
        self.scale = make_param((1,), None, tp, torch.float32, "hc_scale", device)
        self.base = make_param((n,), None, tp, torch.float32, "hc_base", device)

    def args(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(fn, scale, base)``, in the order the ops take them."""
        return self.fn, self.scale, self.base
