"""Model runner: padding, the SP decision, pipeline stages and CUDA graphs (DESIGN §3).

The runner turns a batch of ``T`` tokens into a :class:`ForwardPlan` with one rule set:

* a forward with ``T >= sp_threshold`` (the threshold in effect, ``EngineConfig.sp_min_tokens``)
  is padded to a multiple of tp;
* it shards iff the *padded* count ``P`` satisfies ``P >= sp_threshold and P >= tp``
  (:func:`is_sharded`, the one place that decides). Every rank and every pipeline stage evaluates
  it on the same ``P``, so they always agree;
* otherwise, on CUDA with graphs on, a forward of at most ``max_cudagraph_capture_size`` tokens is
  padded to the next capture size and replayed from a CUDA graph; the config guarantees the
  threshold exceeds that size, so SP never engages on a captured size.

Padding tokens are appended after the real ones and attention is causal, so they never reach a
real token's logits; the runner trims them off.
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
from .model import (DeepseekV4Model, IntermediateTensors, MhcStream, PhaseTimer, RoutingTrace,
                    TPContext, intermediate_shapes)
from .model.parallel import NULL_TIMER

#: Token id used for padding rows.
PAD_TOKEN_ID = 0


def is_sharded(padded_tokens: int, tp_size: int, sp_min_tokens: Optional[int]) -> bool:
    """THE sequence-parallel decision: shard a forward of ``padded_tokens`` (after the runner's
    padding) iff SP is on (``sp_min_tokens`` not None, ``tp_size > 1``) and
    ``padded_tokens >= sp_min_tokens`` and ``padded_tokens >= tp_size``. A pure function of the
    padded count, so every rank and pipeline stage decides alike."""
    if sp_min_tokens is None or tp_size <= 1:
        return False
    return padded_tokens >= sp_min_tokens and padded_tokens >= tp_size


def sp_padded_tokens(num_tokens: int, tp_size: int, sp_min_tokens: Optional[int]) -> int:
    """``num_tokens`` rounded up to a multiple of ``tp_size`` when SP is on and
    ``num_tokens >= sp_min_tokens``; unchanged otherwise."""
    if sp_min_tokens is None or tp_size <= 1 or num_tokens < sp_min_tokens:
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


def plan_forward(num_tokens: int, engine: EngineConfig, device: torch.device | str = "cpu") -> ForwardPlan:
    """The :class:`ForwardPlan` for ``num_tokens`` tokens under ``engine`` on ``device``."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens: expected a positive int, got {num_tokens!r}")
    tp, threshold = engine.parallel.tensor_parallel_size, engine.sp_min_tokens
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


def init_parallel_groups(parallel: ParallelConfig, device: torch.device | str = "cpu") -> ParallelGroups:
    """Create and register the TP and PP groups of ``parallel`` (collective: every rank calls it).

    Global rank = ``pp_rank * tp + tp_rank``. Without torch.distributed only tp = pp = 1 is
    possible (a world of one, group ``"0"``).
    """
    tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
    if not dist.is_initialized():
        if tp * pp != 1:
            raise ValueError(f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} needs "
                             f"torch.distributed with {tp * pp} ranks; it is not initialised")
        name = msd.init(None, device)
        return ParallelGroups(TPContext(0, 1, name), self_group=name)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != tp * pp:
        raise ValueError(f"world size {world} != tensor_parallel_size={tp} x "
                         f"pipeline_parallel_size={pp}")
    pp_rank, tp_rank = divmod(rank, tp)
    # new_group is collective over WORLD: every rank creates every group, in the same order.
    tp_groups = [dist.new_group([p * tp + r for r in range(tp)]) for p in range(pp)]
    pp_groups = [dist.new_group([p * tp + r for p in range(pp)]) for r in range(tp)]
    self_groups = [dist.new_group([r]) for r in range(world)]
    tp_name = msd.init(tp_groups[pp_rank], device)
    self_name = msd.init(self_groups[rank], device)
    return ParallelGroups(TPContext(tp_rank, tp, tp_name), pp_rank, pp, pp_groups[tp_rank], self_name)


@dataclass
class RunnerOutput:
    """``logits (num_tokens, vocab)`` and ``mtp_logits`` on the last pipeline stage (None
    elsewhere), trimmed to the real tokens; the plan used; ``timings``: seconds per phase."""

    logits: Optional[Tensor]
    mtp_logits: Optional[Tensor]
    plan: ForwardPlan
    timings: dict[str, float] = field(default_factory=dict)


class ModelRunner:
    """Runs this rank's stage of :class:`DeepseekV4Model` under an :class:`EngineConfig`.

    Args:
        engine: validated configuration (tp/pp sizes, threshold, graphs, MoE backend).
        groups: from :func:`init_parallel_groups` (default: create them now).
        device: where the model lives; CUDA graphs are used only on CUDA.
        seed: synthetic weight seed (default ``engine.model.seed``).
    """

    def __init__(self, engine: EngineConfig, groups: Optional[ParallelGroups] = None,
                 device: torch.device | str = "cpu", seed: Optional[int] = None):
        if not isinstance(engine, EngineConfig):
            raise TypeError(f"engine: expected an EngineConfig, got {type(engine).__name__}")
        self.engine = engine
        self.device = torch.device(device)
        self.groups = groups if groups is not None else init_parallel_groups(engine.parallel, self.device)
        if self.groups.tp.size != engine.parallel.tensor_parallel_size or \
                self.groups.pp_size != engine.parallel.pipeline_parallel_size:
            raise ValueError(f"groups: tp={self.groups.tp.size}, pp={self.groups.pp_size} do not match "
                             f"the engine's tp={engine.parallel.tensor_parallel_size}, "
                             f"pp={engine.parallel.pipeline_parallel_size}")
        self.model = DeepseekV4Model(engine.model, tp=self.groups.tp, pp_rank=self.groups.pp_rank,
                                     pp_size=self.groups.pp_size, moe_backend=engine.moe_backend,
                                     sequence_parallel=engine.sp_min_tokens is not None,
                                     device=self.device, seed=seed)
        self._graphs: dict[tuple[int, bool], _CapturedForward] = {}

    @property
    def is_last_stage(self) -> bool:
        """This rank runs the last pipeline stage (it returns the logits)."""
        return self.groups.pp_rank == self.groups.pp_size - 1

    def plan(self, num_tokens: int) -> ForwardPlan:
        """The :class:`ForwardPlan` this runner uses for ``num_tokens`` tokens."""
        return plan_forward(num_tokens, self.engine, self.device)

    @torch.no_grad()
    def forward(self, input_ids: Tensor, mtp_input_ids: Optional[Tensor] = None,
                timer: Optional[PhaseTimer] = None,
                routing: Optional[RoutingTrace] = None) -> RunnerOutput:
        """One forward of the batch ``input_ids (T,)`` (the same on every rank). ``mtp_input_ids
        (T,)``: the next token of each position, to run the MTP layer. ``timer``: collects
        per-phase times (eager forwards only). ``routing``: records this stage's MoE expert
        choices (forces an eager forward)."""
        ids = self._check_ids(input_ids, "input_ids")
        T = ids.shape[0]
        if mtp_input_ids is not None:
            mtp_input_ids = self._check_ids(mtp_input_ids, "mtp_input_ids")
            if mtp_input_ids.shape[0] != T:
                raise ValueError(f"mtp_input_ids: expected {T} tokens (as input_ids), got "
                                 f"{mtp_input_ids.shape[0]}")
        plan = self.plan(T)
        ids = self._pad(ids, plan.padded_tokens)
        mtp_ids = self._pad(mtp_input_ids, plan.padded_tokens) if mtp_input_ids is not None else None
        timer = timer if timer is not None else PhaseTimer(sync_cuda=self.device.type == "cuda")
        start = time.perf_counter()

        intermediate = None
        if self.groups.pp_rank > 0:
            with timer.phase("pp_recv"):
                intermediate = self._recv(plan)
        if plan.graph_size is not None and routing is None:
            out = self._graph_forward(plan, ids, mtp_ids, intermediate)
        else:
            out = self.model(ids, sharded=plan.sharded, intermediate=intermediate,
                             mtp_input_ids=mtp_ids, timer=timer, routing=routing)
        if not self.is_last_stage:
            with timer.phase("pp_send"):
                self._send(out.intermediate)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        timings = dict(timer.totals) if isinstance(timer, PhaseTimer) else {}
        timings["total"] = time.perf_counter() - start
        logits = out.logits[:T] if out.logits is not None else None
        mtp_logits = out.mtp_logits[:T] if out.mtp_logits is not None else None
        return RunnerOutput(logits, mtp_logits, plan, timings)

    # ---- helpers ---------------------------------------------------------------------------

    def _check_ids(self, ids: Tensor, name: str) -> Tensor:
        if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype != torch.int64:
            raise ValueError(f"{name}: expected a 1-D int64 tensor of token ids, got "
                             f"{getattr(ids, 'dtype', type(ids).__name__)} {tuple(getattr(ids, 'shape', ()))}")
        if ids.numel() == 0:
            raise ValueError(f"{name}: expected at least one token, got 0")
        vocab = self.engine.model.vocab_size
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"{name}: expected token ids in [0, {vocab}), got values in [{lo}, {hi}]")
        return ids.to(self.device)

    @staticmethod
    def _pad(ids: Tensor, padded: int) -> Tensor:
        if ids.shape[0] == padded:
            return ids
        return torch.cat([ids, ids.new_full((padded - ids.shape[0],), PAD_TOKEN_ID)])

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
        shapes = intermediate_shapes(self.engine.model, plan.padded_tokens, self.groups.tp.size,
                                     plan.sharded)
        tensors = []
        for shape, dtype in shapes:
            t = torch.empty(shape, dtype=dtype, device=self.device)
            dist.recv(t, group=self.groups.pp_group, group_src=src)
            tensors.append(t)
        return IntermediateTensors(tensors[0], MhcStream(*tensors[1:]))

    def _graph_forward(self, plan: ForwardPlan, ids: Tensor, mtp_ids: Optional[Tensor],
                       intermediate: Optional[IntermediateTensors]):
        """Replay (capturing on first use) the CUDA graph of this stage for ``plan.graph_size``."""
        if plan.sharded:
            raise AssertionError("SP must never engage on a captured size")
        key = (plan.graph_size, mtp_ids is not None)
        if key not in self._graphs:
            self._graphs[key] = _CapturedForward(self.model, self.engine, plan.graph_size,
                                                 mtp_ids is not None, self.device)
        return self._graphs[key].replay(ids, mtp_ids, intermediate)


class _CapturedForward:
    """One stage's forward for a fixed padded size, captured as a CUDA graph with static input
    buffers (ids, MTP ids, the pipeline hand-off). Never sharded."""

    def __init__(self, model: DeepseekV4Model, engine: EngineConfig, size: int, with_mtp: bool,
                 device: torch.device):
        self.model = model
        self.ids = torch.full((size,), PAD_TOKEN_ID, dtype=torch.int64, device=device)
        self.mtp_ids = self.ids.clone() if with_mtp else None
        self.intermediate = None
        if not model.is_first:
            shapes = intermediate_shapes(engine.model, size, model.tp.size, sharded=False)
            ts = [torch.zeros(s, dtype=d, device=device) for s, d in shapes]
            self.intermediate = IntermediateTensors(ts[0], MhcStream(*ts[1:]))
        # Warm up on a side stream (allocator pools, lazy init), then capture.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self._run()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._run()

    def _run(self):
        return self.model(self.ids, sharded=False, intermediate=self.intermediate,
                          mtp_input_ids=self.mtp_ids, timer=NULL_TIMER)

    def replay(self, ids: Tensor, mtp_ids: Optional[Tensor], intermediate: Optional[IntermediateTensors]):
        """Copy the inputs into the static buffers, replay, and return copies of the outputs."""
        self.ids.copy_(ids)
        if self.mtp_ids is not None:
            self.mtp_ids.copy_(mtp_ids)
        if self.intermediate is not None:
            for dst, src in zip(self.intermediate.tensors(), intermediate.tensors()):
                dst.copy_(src)
        self.graph.replay()
        out = self.out
        # Outputs live in the graph's pool and are overwritten by the next replay: hand out copies.
        clone = (lambda t: t.clone() if t is not None else None)  # noqa: E731
        inter = None
        if out.intermediate is not None:
            inter = IntermediateTensors(out.intermediate.x.clone(),
                                        MhcStream(*(t.clone() for t in out.intermediate.stream.tensors())))
        return type(out)(logits=clone(out.logits), mtp_logits=clone(out.mtp_logits),
                         intermediate=inter, final_stream=clone(out.final_stream))


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
