# SPDX-License-Identifier: Apache-2.0
"""Tensor-parallel building blocks: RMSNorm, column/row-parallel and replicated linears, the
vocab-parallel embedding and LM head. Weights are bf16; activations are bf16 ``(T, features)``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import ops
from ...reference import rms_norm
from .parallel import TPContext, capturing, make_param


class RMSNorm(nn.Module):
    """Replicated RMSNorm weight ``(H,)``. The fused ops take :attr:`weight` directly as
    ``norm_weight``; calling the module normalises outside the ops (final norm, MTP's enorm)."""

    def __init__(self, hidden: int, eps: float, tp: TPContext, device):
        super().__init__()
        self.eps = eps
        self.weight = make_param((hidden,), None, tp, torch.bfloat16, "norm", device)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class _Linear(nn.Module):
    """``y = x W^T`` with bf16 W ``(out_features, in_features)`` split over the TP group along
    :attr:`split_dim` (None: replicated)."""

    split_dim: int | None

    def __init__(self, in_features: int, out_features: int, tp: TPContext, device):
        super().__init__()
        self.weight = make_param(
            (out_features, in_features), self.split_dim, tp, torch.bfloat16, "linear", device
        )

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)


class ColumnParallelLinear(_Linear):
    """W's output features split over the TP group: each rank returns its ``out_features / tp``
    columns of y. Input: the full ``(T, in_features)``."""

    split_dim = 0


class RowParallelLinear(_Linear):
    """W's input features split over the TP group. Input: this rank's ``in_features / tp`` columns
    of x; each rank's product is a partial ``(T, out)`` bf16 and the sum over ranks is y.

    ``reduce_results=True`` all-reduces the partials and returns y on every rank.
    ``reduce_results=False`` returns this rank's **un-reduced partial**, for a caller that reduces
    it itself: in the model every sublayer's output projection does so, because the next fused
    boundary op reduces it (all-reduce, or reduce-scatter under SP) in the same op as the mHC work.
    """

    split_dim = 1

    def __init__(
        self,
        in_features: int,
        out_features: int,
        tp: TPContext,
        device,
        reduce_results: bool = True,
    ):
        super().__init__(in_features, out_features, tp, device)
        self.tp = tp
        self.reduce_results = reduce_results

    def forward(self, x: Tensor) -> Tensor:
        partial = F.linear(x, self.weight)
        return ops.all_reduce(partial, self.tp.group) if self.reduce_results else partial


class ReplicatedLinear(_Linear):
    """The whole W on every rank (used on token shards, where each rank applies it to its own
    rows)."""

    split_dim = None


class VocabParallelEmbedding(nn.Module):
    """Embedding table split over the TP group by vocabulary rows. Each rank looks up the ids in
    its range (zeros elsewhere) and the group all-reduces, so every rank ends with the replicated
    ``(T, H)`` bf16 embedding that ``fused_entry`` expects. Exactly one rank contributes each row,
    so the result is bit-identical to the tp=1 lookup."""

    def __init__(self, vocab: int, hidden: int, tp: TPContext, device):
        super().__init__()
        self.tp = tp
        self.vocab = vocab
        self.weight = make_param((vocab, hidden), 0, tp, torch.bfloat16, "embedding", device)

    def lookup_local(self, ids: Tensor) -> Tensor:
        """This rank's contribution: rows for ids in its vocab range, zeros for the rest."""
        rows = self.weight.shape[0]
        start = self.tp.rank * rows
        local = ids - start
        mine = (local >= 0) & (local < rows)
        out = F.embedding(torch.where(mine, local, torch.zeros_like(local)), self.weight)
        return out * mine.unsqueeze(-1).to(out.dtype)

    def forward(self, ids: Tensor) -> Tensor:
        # The range check reads values on the host, which graph capture forbids; the runner checks
        # ids before copying them into a graph's static buffer.
        if (
            not capturing(ids)
            and ids.numel()
            and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab)
        ):
            raise ValueError(
                f"input_ids: expected token ids in [0, {self.vocab}), got values in "
                f"[{int(ids.min())}, {int(ids.max())}]"
            )
        return ops.all_reduce(self.lookup_local(ids), self.tp.group)


class ParallelLMHead(nn.Module):
    """LM head split over the TP group by vocabulary rows: each rank computes its logits columns
    (fp32) and the group all-gathers them into the full ``(T, vocab)``."""

    def __init__(self, vocab: int, hidden: int, tp: TPContext, device):
        super().__init__()
        self.tp = tp
        self.weight = make_param((vocab, hidden), 0, tp, torch.bfloat16, "linear", device)

    def forward(self, hidden: Tensor) -> Tensor:
        local = F.linear(hidden.float(), self.weight.float())  # (T, vocab / tp)
        # ops.all_gather concatenates dim 0, so gather the transposed (vocab / tp, T) slices.
        full = ops.all_gather(local.t().contiguous(), self.tp.group)
        return full.t()
