# SPDX-License-Identifier: Apache-2.0
"""``ModelRunner``: wires the plan, the pipeline hand-off, CUDA graphs and the drafter around this
rank's stage of the model (docs/design.md §3). It decides nothing itself: every padding, SP and
graph decision comes from ``runner.plan``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from ...profiling import PhaseTimer
from ..config import EngineConfig
from ..model import DeepseekV4Model, IntermediateTensors, ModelOutput, RoutingTrace
from .calls import PAD_TOKEN_ID, CallTimer, check_token_ids, pad_rows
from .drafter import Drafter, DraftOutput
from .graphs import GraphCache
from .pipeline import ParallelGroups, init_parallel_groups, recv_intermediate, send_intermediate
from .plan import ForwardPlan, plan_forward


@dataclass
class RunnerOutput:
    """One forward. On the last pipeline stage: ``logits (num_tokens, vocab)`` and, when asked,
    ``final_stream (num_tokens, n*H)``, the gathered stream the MTP drafts from, both trimmed to
    the real tokens (None on other stages). ``plan``: how it ran; ``timings``: seconds per phase."""

    logits: Optional[Tensor]
    plan: ForwardPlan
    final_stream: Optional[Tensor] = None
    timings: dict[str, float] = field(default_factory=dict)


class ModelRunner:
    """Runs this rank's stage of :class:`DeepseekV4Model` under an :class:`EngineConfig`.

    Args:
        engine: validated configuration (tp/pp sizes, threshold, graphs, MoE backend, drafts).
        groups: from :func:`init_parallel_groups` (default: create them now).
        device: where the model lives; CUDA graphs are used only on CUDA.
        seed: synthetic weight seed (default ``engine.model.seed``).
    """

    def __init__(
        self,
        engine: EngineConfig,
        groups: Optional[ParallelGroups] = None,
        device: torch.device | str = "cpu",
        seed: Optional[int] = None,
    ):
        if not isinstance(engine, EngineConfig):
            raise TypeError(f"engine: expected an EngineConfig, got {type(engine).__name__}")
        self.engine = engine
        self.device = torch.device(device)
        self.groups = (
            groups if groups is not None else init_parallel_groups(engine.parallel, self.device)
        )
        p = engine.parallel
        if (self.groups.tp.size, self.groups.pp_size) != (
            p.tensor_parallel_size,
            p.pipeline_parallel_size,
        ):
            raise ValueError(
                f"groups: tp={self.groups.tp.size}, pp={self.groups.pp_size} do not match "
                f"the engine's tp={p.tensor_parallel_size}, pp={p.pipeline_parallel_size}"
            )
        self.model = DeepseekV4Model(
            engine.model,
            tp=self.groups.tp,
            pp_rank=self.groups.pp_rank,
            pp_size=self.groups.pp_size,
            moe_backend=engine.moe_backend,
            sequence_parallel=p.enable_sp,
            device=self.device,
            seed=seed,
        )
        self.graphs = GraphCache(self.device)
        self.drafter = Drafter(engine, self.model, self.graphs, self.device)

    @property
    def is_last_stage(self) -> bool:
        """This rank runs the last pipeline stage (it returns the logits and drafts)."""
        return self.groups.is_last_stage

    def plan(self, num_tokens: int) -> ForwardPlan:
        """The :class:`ForwardPlan` of a main forward of ``num_tokens`` tokens (a draft step's:
        ``self.drafter.plan``)."""
        return plan_forward(num_tokens, self.engine, self.device)

    @torch.no_grad()
    def forward(
        self,
        input_ids: Tensor,
        *,
        return_final_stream: bool = False,
        timer: Optional[PhaseTimer] = None,
        routing: Optional[RoutingTrace] = None,
    ) -> RunnerOutput:
        """One forward of the batch ``input_ids (T,)`` (the same on every rank).
        ``return_final_stream``: also return the gathered final stream, the input of
        :meth:`propose`. ``timer``: collects per-phase times (eager forwards only). ``routing``:
        records this stage's MoE expert choices (forces an eager forward)."""
        ids = check_token_ids(input_ids, "input_ids", self.engine.model.vocab_size, self.device)
        T = ids.shape[0]
        plan = self.plan(T)
        ids = pad_rows(ids, plan.padded_tokens, PAD_TOKEN_ID)
        call = CallTimer(timer, self.device)

        intermediate = None
        if self.groups.pp_rank > 0:
            with call.timer.phase("pp_recv"):
                intermediate = recv_intermediate(self.groups, self.engine.model, plan, self.device)
        if plan.graph_size is not None and routing is None:
            inputs = [ids] + ([intermediate.stream] if intermediate is not None else [])
            out = self.graphs.run(
                ("forward", plan.graph_size, return_final_stream),
                self._replicated_forward(return_final_stream),
                inputs,
            )
        else:
            out = self.model(
                ids,
                sharded=plan.sharded,
                intermediate=intermediate,
                return_final_stream=return_final_stream,
                timer=call.timer,
                routing=routing,
            )
        if not self.is_last_stage:
            with call.timer.phase("pp_send"):
                send_intermediate(self.groups, out.intermediate)
        timings = call.finish()
        logits = out.logits[:T] if out.logits is not None else None
        final = out.final_stream[:T] if out.final_stream is not None else None
        return RunnerOutput(logits, plan, final, timings)

    @torch.no_grad()
    def propose(
        self,
        final_stream: Optional[Tensor],
        next_ids: Tensor,
        *,
        num_steps: Optional[int] = None,
        last_token_indices: Optional[Tensor] = None,
        draft_tokens: Optional[list[Tensor]] = None,
        timer: Optional[PhaseTimer] = None,
        routing: Optional[RoutingTrace] = None,
    ) -> DraftOutput:
        """Draft ``num_steps`` tokens (default ``engine.num_speculative_tokens``) with the MTP
        layer, each step a forward of its own that feeds its gathered stream to the next.
        Collective over the last stage's TP group; other stages return an empty result.

        Step 0 runs on every row: ``final_stream (T, n*H)`` (a forward's ``final_stream``) and
        ``next_ids (T,)``, the token after each position. Later steps run on the rows
        ``last_token_indices`` (default: all; e.g. the last token of each request, as an engine
        drafts) and are fed the previous step's greedy tokens, or ``draft_tokens[j]`` when given
        (to replay another run's drafts, e.g. to compare two TP sizes step by step).
        """
        steps = self.engine.num_speculative_tokens if num_steps is None else num_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(
                f"num_steps: expected a positive int (or num_speculative_tokens >= 1 "
                f"in the engine config), got {steps!r}"
            )
        if not self.is_last_stage:
            return DraftOutput()
        return self.drafter.propose(
            final_stream,
            next_ids,
            num_steps=steps,
            last_token_indices=last_token_indices,
            draft_tokens=draft_tokens,
            timer=timer,
            routing=routing,
        )

    def _replicated_forward(self, return_final_stream: bool):
        """This stage's forward that does not shard, as a function of its inputs (for capture)."""

        def run(ids: Tensor, *hand_off: Tensor) -> ModelOutput:
            inter = IntermediateTensors(hand_off[0]) if hand_off else None
            return self.model(
                ids, sharded=False, intermediate=inter, return_final_stream=return_final_stream
            )

        return run
