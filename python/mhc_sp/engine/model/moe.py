# SPDX-License-Identifier: Apache-2.0
"""Mixture-of-experts FFN: softmax router with top-k over the routed experts plus a shared expert.
Every expert's intermediate dimension is split over the TP group (gate/up column-parallel,
down row-parallel), so the layer takes the whole gathered batch ``(T, H)`` (the boundary before it
all-gathers ``layer_input``, SP on or off) and returns this rank's **un-reduced partial**
``(T, H)``, which the next fused boundary reduces.

Backends (``mhc_sp.config.MOE_BACKEND_SUPPORTS_SP``):

* ``"naive"``: for each expert, gather its tokens, run the MLP, scatter-add the weighted result.
  Tokens are independent of each other.
* ``"capacity"``: the same, but each expert accepts at most
  ``ceil(capacity_factor * T * top_k / num_experts)`` tokens, in token order; later ones are dropped
  for that expert. Which tokens drop depends on the whole batch, so the backend is not valid on a
  token shard, where an engine running SP calls its MoE; it is refused whenever SP is enabled
  (see ``mhc_sp.engine.config.moe``).

Both have two formulations with the same math: the eager one gathers each expert's tokens (its
sizes depend on the routing, read on the host); the dense one runs every expert on every token and
weights the result by a routing mask (no host reads: used under CUDA graph capture, or on request).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig, check_moe_backend
from .linear import ColumnParallelLinear, RowParallelLinear
from .parallel import TPContext, capturing, make_param


class RoutingTrace:
    """The expert choices ``(T, k)`` of every MoE call of a forward, in call order (layers, then
    the MTP block), in :attr:`recorded`.

    With ``replay`` (another run's ``recorded``), each MoE call uses the replayed experts instead of
    its own top-k; the weights are still this model's softmax scores at those experts. Comparing two
    models that way (e.g. tp=4 against tp=1) separates real numerical differences from near-tie
    routing flips, which bf16 rounding of the partials can cause under any TP size. Replayed
    choices may have more rows than the forward (a padded run): the first rows are used.
    """

    def __init__(self, replay: Optional[list[Tensor]] = None):
        self.recorded: list[Tensor] = []
        self.replay = replay

    def choose(self, scores: Tensor, top_k: int) -> Tensor:
        """The experts for this call: this model's top-k, or the replayed choice."""
        if self.replay is None:
            ids = scores.topk(top_k, dim=-1).indices
        else:
            call = len(self.recorded)
            if call >= len(self.replay):
                raise ValueError(
                    f"replay: has {len(self.replay)} MoE calls, the forward makes more"
                )
            ids = self.replay[call][: scores.shape[0]].to(scores.device)
            if tuple(ids.shape) != (scores.shape[0], top_k):
                raise ValueError(
                    f"replay[{call}]: expected at least {scores.shape[0]} rows of {top_k} "
                    f"experts, got shape {tuple(self.replay[call].shape)}"
                )
        self.recorded.append(ids)
        return ids


class MoE(nn.Module):
    """``forward(x (T, H) bf16, sharded) -> partial (T, H) bf16`` (this rank's share of the output).

    ``sequence_parallel``: whether SP is enabled for this model (checked against the backend at
    construction; a ``sharded`` forward is checked again).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        tp: TPContext,
        device,
        backend: str = "naive",
        sequence_parallel: bool = False,
    ):
        super().__init__()
        check_moe_backend(backend, sequence_parallel)
        self.backend = backend
        self.top_k = cfg.num_experts_per_tok
        self.num_experts = cfg.num_routed_experts
        self.scaling = cfg.routed_scaling_factor
        self.capacity_factor = cfg.capacity_factor
        E, H, inter = cfg.num_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        # The router sees the full gathered input and full weights on every rank, so every rank
        # routes identically.
        self.router = make_param((E, H), None, tp, torch.bfloat16, "linear", device)
        self.w_gate = make_param((E, inter, H), 1, tp, torch.bfloat16, "linear", device)
        self.w_up = make_param((E, inter, H), 1, tp, torch.bfloat16, "linear", device)
        self.w_down = make_param((E, H, inter), 2, tp, torch.bfloat16, "linear", device)
        shared = cfg.shared_intermediate_size
        self.shared_gate = ColumnParallelLinear(H, shared, tp, device) if shared else None
        self.shared_up = ColumnParallelLinear(H, shared, tp, device) if shared else None
        self.shared_down = (
            RowParallelLinear(shared, H, tp, device, reduce_results=False) if shared else None
        )

    def route(self, x: Tensor, routing: Optional[RoutingTrace] = None) -> tuple[Tensor, Tensor]:
        """Top-k experts per token: ``(ids (T, k) int64, weights (T, k) fp32)``; the weights are the
        softmax scores renormalised over the chosen k, times ``routed_scaling_factor``.
        ``routing``: records (or replays) the choice."""
        scores = F.linear(x.float(), self.router.float()).softmax(-1)
        if routing is None:
            ids = scores.topk(self.top_k, dim=-1).indices
        else:
            ids = routing.choose(scores, self.top_k)
        weights = scores.gather(-1, ids)
        weights = weights / weights.sum(-1, keepdim=True) * self.scaling
        return ids, weights

    def _expert(self, e: int, x: Tensor) -> Tensor:
        """Expert e's MLP on rows x, this rank's intermediate slice: partial (rows, H) bf16."""
        h = F.silu(F.linear(x, self.w_gate[e]).float()) * F.linear(x, self.w_up[e]).float()
        return F.linear(h.to(x.dtype), self.w_down[e])

    def combine_weights(self, ids: Tensor, weights: Tensor, T: int) -> Tensor:
        """Dense routing mask ``(T, num_experts)`` fp32: each token's weight for each expert (0 when
        not routed there, or dropped by the capacity backend), computed without host reads."""
        # (T, k, E) one-hot by comparison: F.one_hot may read ids on the host to validate them.
        experts = torch.arange(self.num_experts, device=ids.device)
        onehot = (ids.unsqueeze(-1) == experts).to(torch.float32)
        if self.backend == "capacity":
            # Position of each assignment within its expert, in (token, slot) order: keep the
            # first `capacity` — the same cut as the eager path's tokens[:capacity].
            flat = onehot.reshape(T * self.top_k, self.num_experts)
            position = flat.cumsum(0) - flat
            onehot = onehot * (position < self._capacity(T)).to(torch.float32).view_as(onehot)
        return (onehot * weights.unsqueeze(-1)).sum(1)

    def _capacity(self, T: int) -> int:
        """Tokens each expert accepts under the capacity backend for a batch of T tokens."""
        return math.ceil(self.capacity_factor * T * self.top_k / self.num_experts)

    def forward(
        self,
        x: Tensor,
        sharded: bool = False,
        dense: bool = False,
        routing: Optional[RoutingTrace] = None,
    ) -> Tensor:
        """This rank's partial of the MoE output for the gathered ``x (T, H)``. ``sharded``: the SP
        decision (a backend not valid with SP raises NotImplementedError). ``dense``: use the
        dense formulation (always used while capturing a CUDA graph). ``routing``: see
        :class:`RoutingTrace`."""
        check_moe_backend(self.backend, sharded)
        T = x.shape[0]
        ids, weights = self.route(x, routing)
        out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
        if dense or capturing(x):
            mask = self.combine_weights(ids, weights, T)
            for e in range(self.num_experts):
                out += self._expert(e, x).float() * mask[:, e : e + 1]
        else:
            capacity = self._capacity(T)
            for e in range(self.num_experts):
                # nonzero() lists assignments in token order, which the capacity cut relies on.
                tokens, slot = (ids == e).nonzero(as_tuple=True)
                if self.backend == "capacity":
                    tokens, slot = tokens[:capacity], slot[:capacity]
                if tokens.numel() == 0:
                    continue
                y = self._expert(e, x[tokens]).float() * weights[tokens, slot].unsqueeze(-1)
                out.index_add_(0, tokens, y)
        if self.shared_down is not None:
            h = F.silu(self.shared_gate(x).float()) * self.shared_up(x).float()
            out += self.shared_down(h.to(x.dtype)).float()
        return out.to(x.dtype)
