# SPDX-License-Identifier: Apache-2.0
"""``DeepseekV4DecoderLayer``: attention and MoE sublayers joined by the fused mHC boundaries."""

from __future__ import annotations

from torch import Tensor, nn

from ... import ops
from ...profiling import NULL_TIMER
from ..config import ModelConfig
from .attention import CausalSelfAttention
from .linear import RMSNorm
from .mhc import HyperConnection, MhcStream
from .moe import MoE, RoutingTrace
from .parallel import TPContext


class DeepseekV4DecoderLayer(nn.Module):
    """One decoder layer. Its two boundaries are single fused ops:

    1. into attention: ``fused_layer`` (post of the previous FFN + pre of this attention,
       ``attn_norm`` fused) — or ``fused_entry`` for the model's first layer;
    2. into the FFN: ``fused_layer`` (post of attention + pre of the FFN, ``ffn_norm`` fused).

    ``forward`` returns the MoE's un-reduced partial and the stream; the *next* layer's boundary
    (or ``fused_head``) reduces that partial.
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
        self.cfg = cfg
        self.tp = tp
        H, eps = cfg.hidden_size, cfg.mhc.norm_eps
        self.attn_hc = HyperConnection(H, cfg.mhc, tp, device)
        self.attn_norm = RMSNorm(H, eps, tp, device)
        self.attn = CausalSelfAttention(H, cfg.num_heads, tp, device)
        self.ffn_hc = HyperConnection(H, cfg.mhc, tp, device)
        self.ffn_norm = RMSNorm(H, eps, tp, device)
        self.moe = MoE(cfg, tp, device, moe_backend, sequence_parallel)

    def attention_boundary(
        self,
        x: Tensor | None,
        stream: MhcStream | Tensor | None,
        *,
        num_tokens: int,
        sharded: bool,
        reduced: bool,
    ) -> tuple[MhcStream, Tensor]:
        """The boundary into this layer's attention, in one of four forms:

        * ``stream is None``: ``x`` is the replicated embedding output ``(T, H)`` → ``fused_entry``.
        * ``reduced=False``: ``x`` is the previous sublayer's un-reduced partial → ``fused_layer``.
        * ``reduced=True``, the stream already on this rank's rows and nothing left to reduce:

          - ``x`` given: it is reduced to those rows (the MTP's input projection) →
            ``mhc_post_pre``: ``fused_layer``'s math minus its reduction;
          - ``x is None``: ``stream`` is a posted stream ``(rows, n, H)`` (the previous pipeline
            stage's hand-off) → ``mhc_pre``;

          then the all-gather of ``layer_input`` when sharded.

        Returns the new stream and the gathered attention input ``(num_tokens, H)``.
        """
        fn, scale, base = self.attn_hc.args()
        group, mhc, norm = self.tp.group, self.cfg.mhc, self.attn_norm.weight
        if stream is None:
            res, post, comb, li = ops.fused_entry(x, fn, scale, base, norm, group, sharded, mhc)
            return MhcStream(res, post, comb), li
        if not reduced:
            res, post, comb, li = ops.fused_layer(
                x, *stream.tensors(), fn, scale, base, norm, group, sharded, num_tokens, mhc
            )
            return MhcStream(res, post, comb), li
        if x is None:
            res = stream
            post, comb, li = ops.mhc_pre(res, fn, scale, base, norm, mhc)
        else:
            res, post, comb, li = ops.mhc_post_pre(x, *stream.tensors(), fn, scale, base, norm, mhc)
        li = ops.all_gather(li, group, num_tokens) if sharded else li[:num_tokens]
        return MhcStream(res, post, comb), li

    def forward(
        self,
        x: Tensor | None,
        stream: MhcStream | Tensor | None,
        *,
        num_tokens: int,
        sharded: bool,
        reduced: bool = False,
        timer=NULL_TIMER,
        routing: RoutingTrace | None = None,
    ) -> tuple[Tensor, MhcStream]:
        """Run the layer. ``x``/``stream``/``reduced``: see :meth:`attention_boundary`;
        ``num_tokens``: tokens of this forward (the padded count); ``sharded``: the runner's SP
        decision; ``routing``: records/replays the MoE's expert choice.
        Returns ``(moe partial (num_tokens, H), stream)``."""
        with timer.phase("boundary"):
            stream, h = self.attention_boundary(
                x, stream, num_tokens=num_tokens, sharded=sharded, reduced=reduced
            )
        with timer.phase("attention"):
            partial = self.attn(h)
        with timer.phase("boundary"):
            fn, scale, base = self.ffn_hc.args()
            res, post, comb, h = ops.fused_layer(
                partial,
                *stream.tensors(),
                fn,
                scale,
                base,
                self.ffn_norm.weight,
                self.tp.group,
                sharded,
                num_tokens,
                self.cfg.mhc,
            )
        with timer.phase("moe"):
            partial = self.moe(h, sharded, routing=routing)
        return partial, MhcStream(res, post, comb)
