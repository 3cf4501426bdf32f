# SPDX-License-Identifier: Apache-2.0
"""Model runner: padding, the SP decision, pipeline stages, MTP drafting and CUDA graphs
(docs/design.md §3).

The runner turns a forward of ``T`` tokens into a :class:`ForwardPlan` with one rule set:

* with SP enabled (``parallel.enable_sp``: tp > 1 and ``sp_threshold`` set), a forward with
  ``T >= sp_threshold`` is padded to a multiple of tp. The threshold is ``parallel.sp_threshold``
  whether or not ``enforce_eager`` is set, never the compile pass's ``sp_min_token_num``;
* it shards iff the *padded* count ``P`` satisfies ``P >= sp_threshold and P >= tp``
  (:func:`is_sharded`, the one place that decides). Every rank and every pipeline stage evaluates
  it on the same ``P``, so they always agree;
* otherwise, on CUDA with graphs on, a forward of at most ``max_cudagraph_capture_size`` tokens is
  padded to the next capture size and replayed from a CUDA graph; the config guarantees the
  threshold exceeds that size, so SP never engages on a captured size.

Padding tokens are appended after the real ones and attention is causal, so they never reach a
real token's logits; the runner trims them off.

Every MTP draft step is a forward of its own (:meth:`ModelRunner.propose`): it plans its own token
count with the same rules, so a draft step can run replicated while the main forward was sharded,
or the reverse.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from . import distributed as msd
from .config import EngineConfig, ParallelConfig
from .model import (
    DeepseekV4Model,
    IntermediateTensors,
    MhcStream,
    ModelOutput,
    RoutingTrace,
    TPContext,
    check_gathered_stream,
    intermediate_shapes,
)
from .profiling import PhaseTimer

#: Token id used for padding rows.
PAD_TOKEN_ID = 0


def is_sharded(padded_tokens: int, tp_size: int, sp_threshold: Optional[int]) -> bool:
    """THE sequence-parallel decision: shard a forward of ``padded_tokens`` (after the runner's
    padding) iff SP is on (``sp_threshold`` not None, ``tp_size > 1``) and
    ``padded_tokens >= sp_threshold`` and ``padded_tokens >= tp_size``. A pure function of the
    padded count, so every rank and pipeline stage decides alike."""
    if sp_threshold is None or tp_size <= 1:
        return False
    return padded_tokens >= sp_threshold and padded_tokens >= tp_size


def sp_padded_tokens(num_tokens: int, tp_size: int, sp_threshold: Optional[int]) -> int:
    """``num_tokens`` rounded up to a multiple of ``tp_size`` when SP is on and
    ``num_tokens >= sp_threshold``; unchanged otherwise."""
    if sp_threshold is None or tp_size <= 1 or num_tokens < sp_threshold:
        return num_tokens
    return -(-num_tokens // tp_size) * tp_size


@dataclass(frozen=True)
class ForwardPlan:
    """How one forward runs: ``num_tokens`` real tokens padded to ``padded_tokens``; ``sharded``
    (SP engaged); ``graph_size``: the CUDA graph replayed (None: eager)."""

    num_tokens: int
    padded_tokens: int
    sharded: bool
    graph_size: Optional[int] = None


def plan_forward(
    num_tokens: int, engine: EngineConfig, device: torch.device | str = "cpu"
) -> ForwardPlan:
    """The :class:`ForwardPlan` for ``num_tokens`` tokens under ``engine`` on ``device``."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens: expected a positive int, got {num_tokens!r}")
    tp, threshold = engine.parallel.tensor_parallel_size, engine.sp_threshold
    padded = sp_padded_tokens(num_tokens, tp, threshold)
    sharded = is_sharded(padded, tp, threshold)
    graph_size = None
    if torch.device(device).type == "cuda" and engine.use_cudagraphs and not sharded:
        sizes = engine.compilation.cudagraph_capture_sizes()
        if num_tokens <= sizes[-1]:
            graph_size = next(s for s in sizes if s >= num_tokens)
            padded = graph_size
            if is_sharded(padded, tp, threshold):  # EngineConfig refuses such configs
                raise AssertionError(f"SP would engage on captured size {graph_size}")
    return ForwardPlan(num_tokens, padded, sharded, graph_size)


@dataclass(frozen=True)
class ParallelGroups:
    """This rank's groups: TP (``tp.group`` registered with mhc_sp), its pipeline stage and the
    pipeline group (the ranks with the same TP rank, one per stage), and a one-rank group
    ``self_group`` (registered with mhc_sp) for running a tp=1 reference on this rank."""

    tp: TPContext
    pp_rank: int = 0
    pp_size: int = 1
    pp_group: Optional[dist.ProcessGroup] = None
    self_group: str = msd.WORLD


def init_parallel_groups(
    parallel: ParallelConfig, device: torch.device | str = "cpu"
) -> ParallelGroups:
    """Create and register the TP and PP groups of ``parallel`` (collective: every rank calls it).

    Global rank = ``pp_rank * tp + tp_rank``. Without torch.distributed only tp = pp = 1 is
    possible (a world of one, group ``"0"``).
    """
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if not dist.is_initialized():
        if tp * pp != 1:
            raise ValueError(
                f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} needs "
                f"torch.distributed with {tp * pp} ranks; it is not initialised"
            )
        name = msd.init(None, device)
        return ParallelGroups(TPContext(0, 1, name), self_group=name)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != tp * pp:
        raise ValueError(
            f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} needs "
            f"{tp * pp} ranks, but the world has {world}"
        )
    pp_rank, tp_rank = divmod(rank, tp)
    # new_group is collective over WORLD: every rank creates every group, in the same order.
    tp_groups = [dist.new_group([p * tp + r for r in range(tp)]) for p in range(pp)]
    pp_groups = [dist.new_group([p * tp + r for p in range(pp)]) for r in range(tp)]
    self_groups = [dist.new_group([r]) for r in range(world)]
    tp_name = msd.init(tp_groups[pp_rank], device)
    self_name = msd.init(self_groups[rank], device)
    return ParallelGroups(
        TPContext(tp_rank, tp, tp_name), pp_rank, pp, pp_groups[tp_rank], self_name
    )


@dataclass
class RunnerOutput:
    """One forward. On the last pipeline stage: ``logits (num_tokens, vocab)`` and, when asked,
    ``final_stream (num_tokens, n*H)``, the gathered stream the MTP drafts from, both trimmed to
    the real tokens (None on other stages). ``plan``: how it ran; ``timings``: seconds per phase."""

    logits: Optional[Tensor]
    plan: ForwardPlan
    final_stream: Optional[Tensor] = None
    timings: dict[str, float] = field(default_factory=dict)


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
        if (
            self.groups.tp.size != engine.parallel.tensor_parallel_size
            or self.groups.pp_size != engine.parallel.pipeline_parallel_size
        ):
            raise ValueError(
                f"groups: tp={self.groups.tp.size}, pp={self.groups.pp_size} do not match "
                f"the engine's tp={engine.parallel.tensor_parallel_size}, "
                f"pp={engine.parallel.pipeline_parallel_size}"
            )
        self.model = DeepseekV4Model(
            engine.model,
            tp=self.groups.tp,
            pp_rank=self.groups.pp_rank,
            pp_size=self.groups.pp_size,
            moe_backend=engine.moe_backend,
            sequence_parallel=engine.parallel.enable_sp,
            device=self.device,
            seed=seed,
        )
        self._graphs: dict[tuple, _CapturedCall] = {}

    @property
    def is_last_stage(self) -> bool:
        """This rank runs the last pipeline stage (it returns the logits and drafts)."""
        return self.groups.pp_rank == self.groups.pp_size - 1

    def plan(self, num_tokens: int) -> ForwardPlan:
        """The :class:`ForwardPlan` this runner uses for a forward of ``num_tokens`` tokens (the
        main model's or one MTP draft step's)."""
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
        ids = self._check_ids(input_ids, "input_ids")
        T = ids.shape[0]
        plan = self.plan(T)
        ids = _pad_rows(ids, plan.padded_tokens, PAD_TOKEN_ID)
        timer = timer if timer is not None else PhaseTimer(sync_cuda=self.device.type == "cuda")
        start = time.perf_counter()

        intermediate = None
        if self.groups.pp_rank > 0:
            with timer.phase("pp_recv"):
                intermediate = self._recv(plan)
        if plan.graph_size is not None and routing is None:
            inputs = [ids] + (intermediate.tensors() if intermediate is not None else [])
            out = self._graph(
                ("forward", plan.graph_size, return_final_stream),
                self._forward_fn(return_final_stream),
                inputs,
            )
        else:
            out = self.model(
                ids,
                sharded=plan.sharded,
                intermediate=intermediate,
                return_final_stream=return_final_stream,
                timer=timer,
                routing=routing,
            )
        if not self.is_last_stage:
            with timer.phase("pp_send"):
                self._send(out.intermediate)
        timings = self._finish(timer, start)
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
        out = DraftOutput()
        if not self.is_last_stage:
            return out
        if self.model.mtp is None:
            raise ValueError("propose: the model has no MTP layer (model.num_mtp_layers=0)")
        ids = self._check_ids(next_ids, "next_ids")
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
        if draft_tokens is not None and len(draft_tokens) < steps:
            raise ValueError(
                f"draft_tokens: expected at least {steps} steps of tokens, got {len(draft_tokens)}"
            )
        timer = timer if timer is not None else PhaseTimer(sync_cuda=self.device.type == "cuda")
        start = time.perf_counter()
        stream = final_stream.to(self.device)
        logits = None  # each step's logits pick the next step's tokens
        for step in range(steps):
            if step == 1 and last_token_indices is not None:
                stream, logits = stream[last_token_indices], logits[last_token_indices]
            if step > 0:
                ids = (
                    logits.argmax(-1)
                    if draft_tokens is None
                    else self._check_ids(draft_tokens[step], f"draft_tokens[{step}]")
                )
                if ids.shape[0] != stream.shape[0]:
                    raise ValueError(
                        f"draft_tokens[{step}]: expected {stream.shape[0]} tokens, "
                        f"got {ids.shape[0]}"
                    )
            with timer.phase("mtp"):
                logits, stream, plan = self._draft_step(stream, ids, routing)
            out.logits.append(logits)
            out.tokens.append(ids)
            out.plans.append(plan)
        out.timings = self._finish(timer, start)
        return out

    # ---- helpers ---------------------------------------------------------------------------

    def _draft_step(self, stream: Tensor, ids: Tensor, routing: Optional[RoutingTrace]):
        """One MTP forward of ``ids.shape[0]`` tokens with its own plan; returns its logits and
        gathered stream trimmed to those tokens, and the plan."""
        T = ids.shape[0]
        plan = self.plan(T)
        stream = _pad_rows(stream, plan.padded_tokens, 0)
        ids = _pad_rows(ids, plan.padded_tokens, PAD_TOKEN_ID)
        if plan.graph_size is not None and routing is None:
            out = self._graph(("mtp", plan.graph_size), self._mtp_fn, [stream, ids])
        else:
            out = self.model.mtp_forward(stream, ids, sharded=plan.sharded, routing=routing)
        return out.logits[:T], out.final_stream[:T], plan

    def _finish(self, timer, start: float) -> dict[str, float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        timings = dict(timer.totals) if isinstance(timer, PhaseTimer) else {}
        timings["total"] = time.perf_counter() - start
        return timings

    def _check_ids(self, ids: Tensor, name: str) -> Tensor:
        if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype != torch.int64:
            raise ValueError(
                f"{name}: expected a 1-D int64 tensor of token ids, got "
                f"{getattr(ids, 'dtype', type(ids).__name__)} {tuple(getattr(ids, 'shape', ()))}"
            )
        if ids.numel() == 0:
            raise ValueError(f"{name}: expected at least one token, got 0")
        vocab = self.engine.model.vocab_size
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(
                f"{name}: expected token ids in [0, {vocab}), got values in [{lo}, {hi}]"
            )
        return ids.to(self.device)

    def _send(self, it: IntermediateTensors) -> None:
        """Hand this stage's token-sharded (or, without SP, full) tensors to the next stage's rank
        with the same TP rank."""
        dst = self.groups.pp_rank + 1
        for t in it.tensors():
            dist.send(t.contiguous(), group=self.groups.pp_group, group_dst=dst)

    def _recv(self, plan: ForwardPlan) -> IntermediateTensors:
        """Receive the previous stage's tensors; their shapes follow from the full padded count
        and the SP decision, which this stage computes exactly as the sender did."""
        src = self.groups.pp_rank - 1
        shapes = intermediate_shapes(
            self.engine.model, plan.padded_tokens, self.groups.tp.size, plan.sharded
        )
        tensors = []
        for shape, dtype in shapes:
            t = torch.empty(shape, dtype=dtype, device=self.device)
            dist.recv(t, group=self.groups.pp_group, group_src=src)
            tensors.append(t)
        return IntermediateTensors(tensors[0], MhcStream(*tensors[1:]))

    def _forward_fn(self, return_final_stream: bool):
        """This stage's unsharded forward as a function of its input tensors (for capture)."""

        def run(ids: Tensor, *hand_off: Tensor) -> ModelOutput:
            inter = IntermediateTensors(hand_off[0], MhcStream(*hand_off[1:])) if hand_off else None
            return self.model(
                ids, sharded=False, intermediate=inter, return_final_stream=return_final_stream
            )

        return run

    def _mtp_fn(self, stream: Tensor, ids: Tensor) -> ModelOutput:
        return self.model.mtp_forward(stream, ids, sharded=False)

    def _graph(self, key: tuple, fn, inputs: list[Tensor]) -> ModelOutput:
        """Replay (capturing on first use) the CUDA graph of ``fn`` for ``key``. Graphs are only
        planned for sizes below the SP threshold, so a captured call never shards."""
        if key not in self._graphs:
            self._graphs[key] = _CapturedCall(fn, inputs, self.device)
        return self._graphs[key].replay(inputs)


def _pad_rows(t: Tensor, rows: int, value) -> Tensor:
    """``t`` with rows of ``value`` appended up to ``rows`` rows."""
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_full((rows - t.shape[0], *t.shape[1:]), value)])


class _CapturedCall:
    """``fn(*inputs)`` captured as a CUDA graph over static copies of ``inputs``."""

    def __init__(self, fn, inputs: list[Tensor], device: torch.device):
        self.inputs = [t.clone() for t in inputs]
        # Warm up on a side stream (allocator pools, lazy init), then capture.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            fn(*self.inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn(*self.inputs)

    def replay(self, inputs: list[Tensor]) -> ModelOutput:
        """Copy ``inputs`` into the static buffers, replay, and return copies of the outputs
        (the originals live in the graph's pool and the next replay overwrites them)."""
        for dst, src in zip(self.inputs, inputs):
            dst.copy_(src)
        self.graph.replay()
        out = self.out
        clone = lambda t: t.clone() if t is not None else None  # noqa: E731
        inter = None
        if out.intermediate is not None:
            stream = MhcStream(*(clone(t) for t in out.intermediate.stream.tensors()))
            inter = IntermediateTensors(clone(out.intermediate.x), stream)
        return ModelOutput(
            logits=clone(out.logits), intermediate=inter, final_stream=clone(out.final_stream)
        )


def logits_tolerance(num_layers: int, reference: Tensor) -> float:
    """Largest fair ``max |logits - reference|`` between two TP sizes of the same model.

    Each TP rank rounds its partial sums to bf16 before they are reduced, so tp > 1 differs from
    tp = 1 by about one bf16 ulp per boundary; the differences add up like a random walk over the
    layers. Measured on the tiny preset: 0.03-0.05 at 2-4 layers and ~0.11 at 16 layers for logits
    of magnitude ~4, i.e. well under half of this bound; a wrong slice or a padding leak gives
    errors of the logits' own magnitude. (Compare with routing replayed — see
    ``mhc_sp.model.RoutingTrace`` — since a near-tie expert choice can flip under any TP size.)
    """
    scale = max(1.0, float(reference.abs().max())) if reference.numel() else 1.0
    return 0.015 * (num_layers + 1) ** 0.5 * scale
