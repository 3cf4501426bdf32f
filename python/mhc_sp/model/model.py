"""``DeepseekV4Model`` (one pipeline stage of it) and its MTP draft layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from .. import ops
from ..ops import shard_rows
from ..config import ModelConfig
from .layer import DeepseekV4DecoderLayer
from .linear import ParallelLMHead, ReplicatedLinear, RMSNorm, VocabParallelEmbedding
from .mhc import HyperConnection, HyperHead, MhcStream
from .moe import RoutingTrace
from .parallel import NULL_TIMER, TPContext


def pp_layer_range(num_layers: int, pp_rank: int, pp_size: int) -> range:
    """Global indices of the layers on pipeline stage ``pp_rank``: contiguous, as even as possible,
    earlier stages taking the remainder."""
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank: expected a value in [0, {pp_size}), got {pp_rank}")
    if num_layers < pp_size:
        raise ValueError(f"num_layers={num_layers} must be >= pipeline_parallel_size={pp_size}")
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return range(start, start + base + (1 if pp_rank < extra else 0))


@dataclass
class IntermediateTensors:
    """What a pipeline stage hands to the next: the last layer's output already reduced to this
    rank's stream rows (``x``), and the stream. Sharded: ``ceil(T / tp)`` rows each; otherwise T."""

    x: Tensor
    stream: MhcStream

    def tensors(self) -> list[Tensor]:
        """``[x, residual, post, comb]``: the order in which stages send and receive them."""
        return [self.x, *self.stream.tensors()]


def intermediate_shapes(cfg: ModelConfig, num_tokens: int, tp_size: int, sharded: bool
                        ) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes of :class:`IntermediateTensors` for a forward of ``num_tokens`` (padded)
    tokens, in ``tensors()`` order: a receiving stage computes them from the same full padded count
    and SP decision as the sender."""
    rows = shard_rows(num_tokens, tp_size) if sharded else num_tokens
    n, H = cfg.mhc.hc_mult, cfg.hidden_size
    return [((rows, H), torch.bfloat16), ((rows, n, H), torch.bfloat16),
            ((rows, n), torch.float32), ((rows, n, n), torch.float32)]


@dataclass
class ModelOutput:
    """``logits (T, vocab)`` fp32 and ``mtp_logits`` on the last stage; ``intermediate`` on the
    others; ``final_stream`` is the last stage's ``fused_head`` ``residual_out`` (this rank's rows)."""

    logits: Optional[Tensor] = None
    mtp_logits: Optional[Tensor] = None
    intermediate: Optional[IntermediateTensors] = None
    final_stream: Optional[Tensor] = None


class DeepseekV4MTP(nn.Module):
    """MTP draft layer. It consumes the main model's final stream (``fused_head``'s
    ``residual_out``: this rank's rows when sharded) and the embeddings of the next tokens, and
    predicts one token further. Everything before its decoder block runs on the token shard:

    1. ``mhc_pre`` on the stream rows with the MTP's own ``hc`` parameters and ``hnorm`` fused:
       collapsed hidden ``h`` plus the post/comb coefficients of an input sublayer;
    2. ``e = enorm(embed(next_ids))`` on the same rows; ``x = eh_proj([e, h])`` (replicated weight);
    3. ``x`` is posted into the stream by the block's first boundary (``reduced`` form), then the
       block runs like any layer and its own ``hc_head`` + the shared final norm / LM head give
       the draft logits.

    The embedding, final norm and LM head are the main model's (shared, not owned here).
    """

    def __init__(self, cfg: ModelConfig, tp: TPContext, device, moe_backend: str = "naive",
                 sequence_parallel: bool = False):
        super().__init__()
        self.cfg, self.tp = cfg, tp
        H, eps = cfg.hidden_size, cfg.mhc.norm_eps
        self.hc = HyperConnection(H, cfg.mhc, tp, device)
        self.hnorm = RMSNorm(H, eps, tp, device)
        self.enorm = RMSNorm(H, eps, tp, device)
        self.eh_proj = ReplicatedLinear(2 * H, H, tp, device)
        self.block = DeepseekV4DecoderLayer(cfg, tp, device, moe_backend, sequence_parallel)
        self.head = HyperHead(H, cfg.mhc, tp, device)

    def forward(self, final_stream: Tensor, next_ids: Tensor, *, embed: VocabParallelEmbedding,
                norm: RMSNorm, lm_head: ParallelLMHead, sharded: bool, timer=NULL_TIMER,
                routing: Optional[RoutingTrace] = None) -> Tensor:
        """Draft logits ``(T, vocab)`` fp32; ``next_ids (T,)`` are the tokens following each
        input position (T = the padded count of this forward)."""
        T = next_ids.shape[0]
        fn, scale, base = self.hc.args()
        post, comb, h = ops.mhc_pre(final_stream, fn, scale, base, self.hnorm.weight, self.cfg.mhc)
        e = embed(next_ids)  # replicated (T, H); collective, so every rank calls it
        if sharded:
            e = ops.shard_tokens(e, self.tp.rank, self.tp.size)  # padding rows are zeros
        x = self.eh_proj(torch.cat([self.enorm(e), h], dim=-1))
        partial, stream = self.block(x, MhcStream(final_stream, post, comb), num_tokens=T,
                                     sharded=sharded, reduced=True, timer=timer, routing=routing)
        hidden, _ = ops.fused_head(partial, *stream.tensors(), *self.head.args(), self.tp.group,
                                   sharded, T, self.cfg.mhc)
        return lm_head(norm(hidden))


class DeepseekV4Model(nn.Module):
    """One pipeline stage of the DeepSeek-V4-style model on one TP rank.

    First stage: embedding → ``fused_entry`` (inside layer 0) → its layers. Last stage: its layers →
    ``fused_head`` → final RMSNorm → LM head (and the MTP layer when ``cfg.num_mtp_layers``).
    Parameter names use global layer indices (``layers.<i>.…``, ``mtp.…``), so a stage or TP rank
    holds exactly its part of the full model's names.

    Args:
        cfg: model dimensions.
        tp: this rank's TP group (registered with ``mhc_sp.distributed.init``).
        pp_rank, pp_size: pipeline stage.
        moe_backend: see ``mhc_sp.model.moe``.
        sequence_parallel: whether SP may engage (refuses MoE backends that cannot shard).
        device: ``"cpu"``, ``"cuda[:i]"`` or ``"meta"`` (shapes only, no weights materialised).
        seed: seed of the synthetic weights (default ``cfg.seed``); ignored on ``"meta"``.
    """

    def __init__(self, cfg: ModelConfig, *, tp: TPContext = TPContext(), pp_rank: int = 0,
                 pp_size: int = 1, moe_backend: str = "naive", sequence_parallel: bool = False,
                 device: torch.device | str = "cpu", seed: Optional[int] = None):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"cfg: expected a ModelConfig, got {type(cfg).__name__}")
        if not isinstance(tp, TPContext):
            raise TypeError(f"tp: expected a TPContext, got {type(tp).__name__}")
        self.cfg, self.tp = cfg, tp
        self.pp_rank, self.pp_size = pp_rank, pp_size
        self.layer_ids = pp_layer_range(cfg.num_layers, pp_rank, pp_size)
        self.is_first = pp_rank == 0
        self.is_last = pp_rank == pp_size - 1
        H, device = cfg.hidden_size, torch.device(device)
        has_mtp = self.is_last and cfg.num_mtp_layers > 0
        # The MTP layer on the last stage re-uses the embedding, so that stage holds it too.
        self.embed = (VocabParallelEmbedding(cfg.vocab_size, H, tp, device)
                      if self.is_first or has_mtp else None)
        self.layers = nn.ModuleDict({str(i): DeepseekV4DecoderLayer(cfg, tp, device, moe_backend,
                                                                    sequence_parallel)
                                     for i in self.layer_ids})
        if self.is_last:
            self.head = HyperHead(H, cfg.mhc, tp, device)
            self.norm = RMSNorm(H, cfg.mhc.norm_eps, tp, device)
            self.lm_head = ParallelLMHead(cfg.vocab_size, H, tp, device)
        self.mtp = DeepseekV4MTP(cfg, tp, device, moe_backend, sequence_parallel) if has_mtp else None
        if device.type != "meta":
            from .weights import init_synthetic  # weights imports this module's names

            init_synthetic(self, cfg.seed if seed is None else seed)

    def forward(self, input_ids: Tensor, *, sharded: bool,
                intermediate: Optional[IntermediateTensors] = None,
                mtp_input_ids: Optional[Tensor] = None, timer=NULL_TIMER,
                routing: Optional[RoutingTrace] = None) -> ModelOutput:
        """Run this stage on ``input_ids (T,)`` int64 (T = the padded count: every stage needs it).

        ``sharded``: the runner's SP decision (same on every rank and stage). ``intermediate``:
        the previous stage's hand-off (required on every stage but the first). ``mtp_input_ids``:
        the next token of every position; when given on the last stage with an MTP layer, the
        draft logits are computed too. ``routing``: records (or replays) every MoE's expert
        choice, see ``mhc_sp.model.moe.RoutingTrace``.
        """
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 1 or input_ids.dtype != torch.int64:
            raise ValueError(f"input_ids: expected a 1-D int64 tensor of token ids, got "
                             f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} "
                             f"{tuple(getattr(input_ids, 'shape', ()))}")
        T = input_ids.shape[0]
        if T == 0:
            raise ValueError("input_ids: expected at least one token, got 0")
        if self.is_first:
            if intermediate is not None:
                raise ValueError("intermediate: the first pipeline stage takes input_ids only")
            with timer.phase("embed"):
                x = self.embed(input_ids)
            stream, reduced = None, False
        else:
            self._check_intermediate(intermediate, T, sharded)
            x, stream, reduced = intermediate.x, intermediate.stream, True
        for layer in self.layers.values():
            x, stream = layer(x, stream, num_tokens=T, sharded=sharded, reduced=reduced, timer=timer,
                              routing=routing)
            reduced = False
        if not self.is_last:
            with timer.phase("boundary"):
                x = ops.reduce_scatter(x, self.tp.group) if sharded else ops.all_reduce(x, self.tp.group)
            return ModelOutput(intermediate=IntermediateTensors(x, stream))
        with timer.phase("boundary"):
            hidden, final_stream = ops.fused_head(x, *stream.tensors(), *self.head.args(),
                                                  self.tp.group, sharded, T, self.cfg.mhc)
        with timer.phase("lm_head"):
            logits = self.lm_head(self.norm(hidden))
        mtp_logits = None
        if mtp_input_ids is not None and self.mtp is not None:
            if not isinstance(mtp_input_ids, Tensor) or tuple(mtp_input_ids.shape) != (T,) \
                    or mtp_input_ids.dtype != torch.int64:
                raise ValueError(f"mtp_input_ids: expected an int64 tensor of shape ({T},), got "
                                 f"{getattr(mtp_input_ids, 'dtype', None)} "
                                 f"{tuple(getattr(mtp_input_ids, 'shape', ()))}")
            with timer.phase("mtp"):
                mtp_logits = self.mtp(final_stream, mtp_input_ids, embed=self.embed, norm=self.norm,
                                      lm_head=self.lm_head, sharded=sharded, timer=NULL_TIMER,
                                      routing=routing)
        return ModelOutput(logits=logits, mtp_logits=mtp_logits, final_stream=final_stream)

    def _check_intermediate(self, it: Optional[IntermediateTensors], T: int, sharded: bool) -> None:
        if not isinstance(it, IntermediateTensors):
            raise ValueError(f"intermediate: pipeline stage {self.pp_rank} needs the previous stage's "
                             f"IntermediateTensors, got {type(it).__name__}")
        expected = intermediate_shapes(self.cfg, T, self.tp.size, sharded)
        for name, t, (shape, dtype) in zip(("x", "residual", "post", "comb"), it.tensors(), expected):
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(f"intermediate.{name}: expected {dtype} {shape} for {T} tokens "
                                 f"(sharded={sharded}, tp={self.tp.size}), got {t.dtype} {tuple(t.shape)}")
