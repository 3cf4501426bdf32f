# SPDX-License-Identifier: Apache-2.0
"""Causal multi-head self-attention stand-in: TP column-parallel q/k/v (heads split over the
group), row-parallel output projection returning the un-reduced partial. The SP flow only sees
its gathered ``(T, H)`` input and its ``(T, H)`` partial output; there is no positional encoding
and the T tokens form one causal sequence."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .linear import ColumnParallelLinear, RowParallelLinear
from .parallel import TPContext


class CausalSelfAttention(nn.Module):
    """``num_heads / tp`` heads per rank. ``forward(x (T, H) bf16) -> partial (T, H) bf16``."""

    def __init__(self, hidden: int, num_heads: int, tp: TPContext, device):
        super().__init__()
        if num_heads % tp.size:
            raise ValueError(
                f"num_heads={num_heads} must be divisible by tensor_parallel_size={tp.size}"
            )
        self.head_dim = hidden // num_heads
        self.local_heads = num_heads // tp.size
        self.wq = ColumnParallelLinear(hidden, hidden, tp, device)
        self.wk = ColumnParallelLinear(hidden, hidden, tp, device)
        self.wv = ColumnParallelLinear(hidden, hidden, tp, device)
        self.wo = RowParallelLinear(hidden, hidden, tp, device, reduce_results=False)

    def forward(self, x: Tensor) -> Tensor:
        T = x.shape[0]

        def heads(t: Tensor) -> Tensor:  # (T, local_heads * d) -> (local_heads, T, d), fp32
            return t.view(T, self.local_heads, self.head_dim).transpose(0, 1).float()

        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        # Causal: token t sees tokens <= t only, so padding appended after the real tokens can
        # never change a real token's output.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(0, 1).reshape(T, self.local_heads * self.head_dim).to(x.dtype)
        return self.wo(out)
