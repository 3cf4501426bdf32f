# SPDX-License-Identifier: Apache-2.0
"""``DeepseekV4Model`` (one pipeline stage of it) and its MTP draft layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from ... import ops
from ...ops import shard_rows
from ...profiling import NULL_TIMER
from ..config import ModelConfig
from .layer import DeepseekV4DecoderLayer
from .linear import ParallelLMHead, ReplicatedLinear, RMSNorm, VocabParallelEmbedding
from .mhc import HyperConnection, HyperHead, MhcStream
from .moe import RoutingTrace
from .parallel import TPContext


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
    """What a pipeline stage hands to the next (docs/design.md §3), as the engine does: the posted
    residual stream, this rank's rows ``(rows, n, H)`` bf16 (``ceil(T / tp)`` when sharded, else
    T). The stage has reduced its last sublayer's output and run ``mhc_post``; the next stage
    starts with ``mhc_pre``."""

    stream: Tensor


def intermediate_shape(
    cfg: ModelConfig, num_tokens: int, tp_size: int, sharded: bool
) -> tuple[int, int, int]:
    """Shape of the hand-off (``IntermediateTensors.stream``, bf16) of a forward of
    ``num_tokens`` (padded) tokens: a receiving stage computes it from the same full padded count
    and SP decision as the sender."""
    rows = shard_rows(num_tokens, tp_size) if sharded else num_tokens
    return (rows, cfg.mhc.hc_mult, cfg.hidden_size)


def check_sequence_parallel(sharded: bool, sequence_parallel: bool) -> None:
    """Raises ValueError naming ``sharded`` when a forward asks to run sharded in a model built
    without sequence parallelism (the engine's model gates SP on its own config)."""
    if sharded and not sequence_parallel:
        raise ValueError(
            "sharded: True needs sequence parallelism enabled for this model "
            "(sequence_parallel=True: tensor_parallel_size > 1 and sp_threshold set), "
            "but it was built with sequence_parallel=False"
        )


@dataclass
class ModelOutput:
    """What one forward of a pipeline stage, or of the MTP layer, returns.

    Last stage (and MTP): ``logits (T, vocab)`` fp32 and, when asked, ``final_stream (T, n*H)``
    bf16: the residual stream before the head's collapse, all-gathered so that every rank holds
    every row (the engine keeps it in the MTP layer's input buffer; the MTP's own final stream
    feeds its next draft step). Other stages: ``intermediate``, the hand-off to the next stage.
    """

    logits: Optional[Tensor] = None
    intermediate: Optional[IntermediateTensors] = None
    final_stream: Optional[Tensor] = None


def check_gathered_stream(arg: str, stream, T: int, n: int, H: int, what: str) -> None:
    """Raises ValueError naming ``arg`` unless ``stream`` is a bf16 ``(T, n*H)`` tensor: a gathered
    pre-head stream (``what`` says which rows the caller expects)."""
    if (
        not isinstance(stream, Tensor)
        or tuple(stream.shape) != (T, n * H)
        or stream.dtype != torch.bfloat16
    ):
        raise ValueError(
            f"{arg}: expected a bfloat16 tensor of shape ({T}, {n * H}) ({what}), got "
            f"{getattr(stream, 'dtype', type(stream).__name__)} "
            f"{tuple(getattr(stream, 'shape', ()))}"
        )


def gather_stream(rows: Tensor, num_tokens: int, tp: TPContext, sharded: bool) -> Tensor:
    """The final stream ``(num_tokens, n*H)`` on every rank from this rank's ``(rows, n, H)``:
    an all-gather of the token shards when ``sharded``, else the rows themselves (every rank
    already holds all of them)."""
    flat = rows.reshape(rows.shape[0], -1)
    return ops.all_gather(flat, tp.group, num_tokens) if sharded else flat[:num_tokens]


class DeepseekV4MTP(nn.Module):
    """MTP draft layer: its own forward, with its own token count and SP decision.

    Input: a gathered final stream ``(T, n*H)`` (the main model's, or the previous draft step's)
    and ``next_ids (T,)``, the token that follows each row's position. It predicts one token
    further. When ``sharded``, the layer takes its own token shard of the stream
    (``shard_tokens``), so everything before its decoder block runs on ``ceil(T / tp)`` rows:

    1. ``mhc_pre`` on the stream rows with the MTP's own ``hc`` parameters and ``hnorm`` fused:
       collapsed hidden ``h`` plus the post/comb coefficients of an input sublayer;
    2. ``e = enorm(embed(next_ids))`` on the same rows; ``x = eh_proj([e, h])`` (replicated weight);
    3. ``x`` is posted into the stream by the block's first boundary (``reduced`` form), then the
       block runs like any layer; its own ``hc_head`` and the shared final norm / LM head give
       the draft logits, and its pre-head stream, gathered, is returned for the next step.

    The embedding, final norm and LM head are the main model's (shared, not owned here).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        tp: TPContext,
        device,
        moe_backend: str = "naive",
        sequence_parallel: bool = False,
    ):
        super().__init__()
        self.cfg, self.tp = cfg, tp
        self.sequence_parallel = sequence_parallel
        H, eps = cfg.hidden_size, cfg.mhc.norm_eps
        self.hc = HyperConnection(H, cfg.mhc, tp, device)
        self.hnorm = RMSNorm(H, eps, tp, device)
        self.enorm = RMSNorm(H, eps, tp, device)
        self.eh_proj = ReplicatedLinear(2 * H, H, tp, device)
        self.block = DeepseekV4DecoderLayer(cfg, tp, device, moe_backend, sequence_parallel)
        self.head = HyperHead(H, cfg.mhc, tp, device)

    def forward(
        self,
        stream: Tensor,
        next_ids: Tensor,
        *,
        embed: VocabParallelEmbedding,
        norm: RMSNorm,
        lm_head: ParallelLMHead,
        sharded: bool,
        return_final_stream: bool = True,
        timer=NULL_TIMER,
        routing: Optional[RoutingTrace] = None,
    ) -> ModelOutput:
        """Draft logits ``(T, vocab)`` fp32 and (``return_final_stream``) this layer's gathered
        pre-head stream ``(T, n*H)``. ``stream (T, n*H)`` bf16 and ``next_ids (T,)`` int64, the
        same on every rank; ``sharded``: this forward's SP decision (only with
        ``sequence_parallel``)."""
        check_sequence_parallel(sharded, self.sequence_parallel)
        n, H = self.cfg.mhc.hc_mult, self.cfg.hidden_size
        T = next_ids.shape[0]
        check_gathered_stream("stream", stream, T, n, H, "one gathered row per next token")
        with timer.phase("boundary"):
            rows = ops.shard_tokens(stream, self.tp.rank, self.tp.size) if sharded else stream
            residual = rows.view(rows.shape[0], n, H)
            fn, scale, base = self.hc.args()
            post, comb, h = ops.mhc_pre(residual, fn, scale, base, self.hnorm.weight, self.cfg.mhc)
        with timer.phase("embed"):
            e = embed(next_ids)  # replicated (T, H); collective, so every rank calls it
            if sharded:
                e = ops.shard_tokens(e, self.tp.rank, self.tp.size)  # padding rows are zeros
        x = self.eh_proj(torch.cat([self.enorm(e), h], dim=-1))
        partial, out = self.block(
            x,
            MhcStream(residual, post, comb),
            num_tokens=T,
            sharded=sharded,
            reduced=True,
            timer=timer,
            routing=routing,
        )
        with timer.phase("boundary"):
            hidden, final_rows = ops.fused_head(
                partial, *out.tensors(), *self.head.args(), self.tp.group, sharded, T, self.cfg.mhc
            )
        with timer.phase("lm_head"):
            logits = lm_head(norm(hidden))
        with timer.phase("boundary"):
            final = gather_stream(final_rows, T, self.tp, sharded) if return_final_stream else None
        return ModelOutput(logits=logits, final_stream=final)


class DeepseekV4Model(nn.Module):
    """One pipeline stage of the DeepSeek-V4-style model on one TP rank.

    First stage: embedding → ``fused_entry`` (inside layer 0) → its layers. Last stage: its layers →
    ``fused_head`` → final RMSNorm → LM head; it also holds the MTP layer when
    ``cfg.num_mtp_layers``, run as a forward of its own by :meth:`mtp_forward`.
    Parameter names use global layer indices (``layers.<i>.…``, ``mtp.…``), so a stage or TP rank
    holds exactly its part of the full model's names.

    Args:
        cfg: model dimensions.
        tp: this rank's TP group (registered with ``mhc_sp.distributed.init``).
        pp_rank, pp_size: pipeline stage.
        moe_backend: see ``mhc_sp.engine.model.moe``.
        sequence_parallel: whether SP is enabled (refuses a MoE backend not valid with SP, and
            a ``sharded`` forward without it).
        device: ``"cpu"``, ``"cuda[:i]"`` or ``"meta"`` (shapes only, no weights materialised).
        seed: seed of the synthetic weights (default ``cfg.seed``); ignored on ``"meta"``.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        tp: TPContext = TPContext(),
        pp_rank: int = 0,
        pp_size: int = 1,
        moe_backend: str = "naive",
        sequence_parallel: bool = False,
        device: torch.device | str = "cpu",
        seed: Optional[int] = None,
    ):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"cfg: expected a ModelConfig, got {type(cfg).__name__}")
        if not isinstance(tp, TPContext):
            raise TypeError(f"tp: expected a TPContext, got {type(tp).__name__}")
        self.cfg, self.tp = cfg, tp
        self.pp_rank, self.pp_size = pp_rank, pp_size
        self.sequence_parallel = sequence_parallel
        self.layer_ids = pp_layer_range(cfg.num_layers, pp_rank, pp_size)
        self.is_first = pp_rank == 0
        self.is_last = pp_rank == pp_size - 1
        H, device = cfg.hidden_size, torch.device(device)
        has_mtp = self.is_last and cfg.num_mtp_layers > 0
        # The MTP layer on the last stage re-uses the embedding, so that stage holds it too.
        self.embed = (
            VocabParallelEmbedding(cfg.vocab_size, H, tp, device)
            if self.is_first or has_mtp
            else None
        )
        self.layers = nn.ModuleDict(
            {
                str(i): DeepseekV4DecoderLayer(cfg, tp, device, moe_backend, sequence_parallel)
                for i in self.layer_ids
            }
        )
        if self.is_last:
            self.head = HyperHead(H, cfg.mhc, tp, device)
            self.norm = RMSNorm(H, cfg.mhc.norm_eps, tp, device)
            self.lm_head = ParallelLMHead(cfg.vocab_size, H, tp, device)
        self.mtp = (
            DeepseekV4MTP(cfg, tp, device, moe_backend, sequence_parallel) if has_mtp else None
        )
        if device.type != "meta":
            from .weights import init_synthetic  # weights imports this module's names

            init_synthetic(self, cfg.seed if seed is None else seed)

    def forward(
        self,
        input_ids: Tensor,
        *,
        sharded: bool,
        intermediate: Optional[IntermediateTensors] = None,
        return_final_stream: bool = False,
        timer=NULL_TIMER,
        routing: Optional[RoutingTrace] = None,
    ) -> ModelOutput:
        """Run this stage on ``input_ids (T,)`` int64 (T = the padded count: every stage needs it).

        ``sharded``: the runner's SP decision (same on every rank and stage; only with
        ``sequence_parallel``). ``intermediate``:
        the previous stage's hand-off (required on every stage but the first).
        ``return_final_stream``: on the last stage, also return the gathered final stream
        ``(T, n*H)`` that the MTP layer drafts from (see :meth:`mtp_forward`). ``routing``:
        records (or replays) every MoE's expert choice, see
        ``mhc_sp.engine.model.moe.RoutingTrace``.
        """
        if (
            not isinstance(input_ids, Tensor)
            or input_ids.dim() != 1
            or input_ids.dtype != torch.int64
        ):
            raise ValueError(
                f"input_ids: expected a 1-D int64 tensor of token ids, got "
                f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} "
                f"{tuple(getattr(input_ids, 'shape', ()))}"
            )
        T = input_ids.shape[0]
        if T == 0:
            raise ValueError("input_ids: expected at least one token, got 0")
        check_sequence_parallel(sharded, self.sequence_parallel)
        if self.is_first:
            if intermediate is not None:
                raise ValueError("intermediate: the first pipeline stage takes input_ids only")
            with timer.phase("embed"):
                x = self.embed(input_ids)
            stream, reduced = None, False
        else:
            self._check_intermediate(intermediate, T, sharded)
            # The posted stream: this stage's first boundary is mhc_pre (+ the all-gather).
            x, stream, reduced = None, intermediate.stream, True
        for layer in self.layers.values():
            x, stream = layer(
                x,
                stream,
                num_tokens=T,
                sharded=sharded,
                reduced=reduced,
                timer=timer,
                routing=routing,
            )
            reduced = False
        if not self.is_last:
            with timer.phase("boundary"):
                x = (
                    ops.reduce_scatter(x, self.tp.group)
                    if sharded
                    else ops.all_reduce(x, self.tp.group)
                )
                posted = ops.mhc_post(x, *stream.tensors())
            return ModelOutput(intermediate=IntermediateTensors(posted))
        with timer.phase("boundary"):
            hidden, final_rows = ops.fused_head(
                x, *stream.tensors(), *self.head.args(), self.tp.group, sharded, T, self.cfg.mhc
            )
        with timer.phase("lm_head"):
            logits = self.lm_head(self.norm(hidden))
        with timer.phase("boundary"):
            final = gather_stream(final_rows, T, self.tp, sharded) if return_final_stream else None
        return ModelOutput(logits=logits, final_stream=final)

    def mtp_forward(
        self,
        stream: Tensor,
        next_ids: Tensor,
        *,
        sharded: bool,
        return_final_stream: bool = True,
        timer=NULL_TIMER,
        routing: Optional[RoutingTrace] = None,
    ) -> ModelOutput:
        """One MTP draft step on the last stage: ``stream (T, n*H)`` gathered (the main forward's
        ``final_stream`` or the previous step's), ``next_ids (T,)``; ``sharded``: this step's own
        SP decision. Returns the draft logits and the MTP's gathered final stream."""
        if self.mtp is None:
            raise ValueError(
                f"mtp_forward: pipeline stage {self.pp_rank} of {self.pp_size} has no "
                f"MTP layer (num_mtp_layers={self.cfg.num_mtp_layers}; only the last "
                f"stage holds it)"
            )
        if (
            not isinstance(next_ids, Tensor)
            or next_ids.dim() != 1
            or next_ids.dtype != torch.int64
            or next_ids.numel() == 0
        ):
            raise ValueError(
                f"next_ids: expected a non-empty 1-D int64 tensor of token ids, got "
                f"{getattr(next_ids, 'dtype', type(next_ids).__name__)} "
                f"{tuple(getattr(next_ids, 'shape', ()))}"
            )
        return self.mtp(
            stream,
            next_ids,
            embed=self.embed,
            norm=self.norm,
            lm_head=self.lm_head,
            sharded=sharded,
            return_final_stream=return_final_stream,
            timer=timer,
            routing=routing,
        )

    def _check_intermediate(self, it: Optional[IntermediateTensors], T: int, sharded: bool) -> None:
        if not isinstance(it, IntermediateTensors):
            raise ValueError(
                f"intermediate: pipeline stage {self.pp_rank} needs the previous stage's "
                f"IntermediateTensors, got {type(it).__name__}"
            )
        shape, t = intermediate_shape(self.cfg, T, self.tp.size, sharded), it.stream
        if not isinstance(t, Tensor) or tuple(t.shape) != shape or t.dtype != torch.bfloat16:
            raise ValueError(
                f"intermediate.stream: expected torch.bfloat16 {shape} for {T} tokens "
                f"(sharded={sharded}, tp={self.tp.size}), got "
                f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}"
            )
