# SPDX-License-Identifier: Apache-2.0
"""MTP drafting: every draft step is a forward of its own, with its own token count and SP
decision (``plan_forward(..., draft=True)``), fed the previous step's gathered stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from ...profiling import PhaseTimer
from ..config import EngineConfig
from ..model import DeepseekV4Model, ModelOutput, RoutingTrace, check_gathered_stream
from .calls import PAD_TOKEN_ID, CallTimer, check_token_ids, pad_rows
from .graphs import GraphCache
from .plan import ForwardPlan, plan_forward


@dataclass
class DraftOutput:
    """MTP draft steps, one entry per step (empty lists off the last pipeline stage).

    ``logits[j] (T_j, vocab)``: step j's draft logits; ``tokens[j] (T_j,)``: the ids step j was
    fed (step 0: the given next tokens; later steps: the previous step's greedy choice);
    ``plans[j]``: step j's own plan (token count, padding, SP decision); ``timings``: seconds per
    phase, summed over the steps."""

    logits: list[Tensor] = field(default_factory=list)
    tokens: list[Tensor] = field(default_factory=list)
    plans: list[ForwardPlan] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


class Drafter:
    """Runs the MTP layer of the last stage's ``model`` as draft steps."""

    def __init__(self, engine: EngineConfig, model: DeepseekV4Model, graphs: GraphCache, device):
        self.engine, self.model, self.graphs, self.device = engine, model, graphs, device

    def plan(self, num_tokens: int) -> ForwardPlan:
        """The plan of one draft step of ``num_tokens`` tokens."""
        return plan_forward(num_tokens, self.engine, self.device, draft=True)

    def propose(
        self,
        final_stream: Optional[Tensor],
        next_ids: Tensor,
        *,
        num_steps: int,
        last_token_indices: Optional[Tensor] = None,
        draft_tokens: Optional[list[Tensor]] = None,
        timer: Optional[PhaseTimer] = None,
        routing: Optional[RoutingTrace] = None,
    ) -> DraftOutput:
        """See ``ModelRunner.propose``."""
        if self.model.mtp is None:
            raise ValueError("propose: the model has no MTP layer (model.num_mtp_layers=0)")
        ids = self._ids(next_ids, "next_ids")
        n, H = self.engine.model.mhc.hc_mult, self.engine.model.hidden_size
        T = ids.shape[0]
        check_gathered_stream(
            "final_stream", final_stream, T, n, H, f"a forward's final_stream for the {T} next_ids"
        )
        if last_token_indices is not None:
            last_token_indices = torch.as_tensor(last_token_indices, dtype=torch.int64)
            if (
                last_token_indices.dim() != 1
                or last_token_indices.numel() == 0
                or int(last_token_indices.min()) < 0
                or int(last_token_indices.max()) >= T
            ):
                raise ValueError(
                    f"last_token_indices: expected a non-empty 1-D list of row "
                    f"indices in [0, {T}), got {last_token_indices.tolist()}"
                )
            last_token_indices = last_token_indices.to(self.device)
        if draft_tokens is not None and len(draft_tokens) < num_steps:
            raise ValueError(
                f"draft_tokens: expected at least {num_steps} steps of tokens, "
                f"got {len(draft_tokens)}"
            )
        call = CallTimer(timer, self.device)
        out = DraftOutput()
        stream = final_stream.to(self.device)
        logits = None  # each step's logits pick the next step's tokens
        for step in range(num_steps):
            if step == 1 and last_token_indices is not None:
                stream, logits = stream[last_token_indices], logits[last_token_indices]
            if step > 0:
                ids = (
                    logits.argmax(-1)
                    if draft_tokens is None
                    else self._ids(draft_tokens[step], f"draft_tokens[{step}]")
                )
                if ids.shape[0] != stream.shape[0]:
                    raise ValueError(
                        f"draft_tokens[{step}]: expected {stream.shape[0]} tokens, "
                        f"got {ids.shape[0]}"
                    )
            with call.timer.phase("mtp"):
                logits, stream, plan = self.step(stream, ids, routing)
            out.logits.append(logits)
            out.tokens.append(ids)
            out.plans.append(plan)
        out.timings = call.finish()
        return out

    def step(self, stream: Tensor, ids: Tensor, routing: Optional[RoutingTrace]):
        """One MTP forward of ``ids.shape[0]`` tokens with its own plan; returns its logits and
        gathered stream trimmed to those tokens, and the plan."""
        T = ids.shape[0]
        plan = self.plan(T)
        stream = pad_rows(stream, plan.padded_tokens, 0)
        ids = pad_rows(ids, plan.padded_tokens, PAD_TOKEN_ID)
        if plan.graph_size is not None and routing is None:
            out = self.graphs.run(("mtp", plan.graph_size), self._replicated_step, [stream, ids])
        else:
            out = self.model.mtp_forward(stream, ids, sharded=plan.sharded, routing=routing)
        return out.logits[:T], out.final_stream[:T], plan

    def _replicated_step(self, stream: Tensor, ids: Tensor) -> ModelOutput:
        """A draft step that does not shard, as a function of its inputs (for capture)."""
        return self.model.mtp_forward(stream, ids, sharded=False)

    def _ids(self, ids, name: str) -> Tensor:
        return check_token_ids(ids, name, self.engine.model.vocab_size, self.device)
