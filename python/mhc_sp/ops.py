# SPDX-License-Identifier: Apache-2.0
"""Typed Python API over ``torch.ops.mhc_sp.*`` (docs/design.md, "Op schemas").

Every function takes the mHC constants from an ``MhcConfig`` (DeepSeek-V4 defaults). Stream
tensors are bf16 and contiguous: ``residual (T, n, H)``, hidden states ``(T, H)``; coefficients are
fp32: ``post (T, n)``, ``comb (T, n, n)`` (first comb index = input stream). Bad arguments raise
TypeError/ValueError naming the argument.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .config import MhcConfig
from .distributed import GroupLike, group_name

DEFAULT = MhcConfig()
_ops = torch.ops.mhc_sp


def mhc_pre(
    residual: Tensor,
    fn: Tensor,
    hc_scale: Tensor,
    hc_base: Tensor,
    norm_weight: Optional[Tensor] = None,
    cfg: MhcConfig = DEFAULT,
) -> tuple[Tensor, Tensor, Tensor]:
    """Collapse the n streams into a sublayer input.

    Args: residual (T, n, H) bf16; fn (n(n+2), n*H) fp32; hc_scale (3,) fp32; hc_base (n(n+2),)
    fp32; norm_weight (H,) bf16/fp32 fuses the sublayer's RMSNorm.
    Returns ``(post (T, n), comb (T, n, n), layer_input (T, H) bf16)``.
    """
    return _ops.mhc_pre(residual, fn, hc_scale, hc_base, norm_weight, *cfg.scalars())


def mhc_post(x: Tensor, residual: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    """Write a sublayer output ``x (T, H)`` back into the streams: returns the new residual
    ``out[t, j] = post[t, j] x[t] + sum_i comb[t, i, j] residual[t, i]`` (T, n, H) bf16."""
    return _ops.mhc_post(x, residual, post, comb)


def mhc_post_pre(
    x: Tensor,
    residual: Tensor,
    post: Tensor,
    comb: Tensor,
    fn: Tensor,
    hc_scale: Tensor,
    hc_base: Tensor,
    norm_weight: Optional[Tensor] = None,
    cfg: MhcConfig = DEFAULT,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``mhc_post`` then ``mhc_pre`` of the next sublayer in one pass over the stream.
    Returns ``(residual_out, post, comb, layer_input)``."""
    return _ops.mhc_post_pre(
        x, residual, post, comb, fn, hc_scale, hc_base, norm_weight, *cfg.scalars()
    )


def mhc_pre_broadcast(
    x: Tensor,
    fn: Tensor,
    hc_scale: Tensor,
    hc_base: Tensor,
    norm_weight: Optional[Tensor] = None,
    cfg: MhcConfig = DEFAULT,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """First layer: replicate the embedding output ``x (T, H)`` into n streams and run
    ``mhc_pre``. Returns ``(residual (T, n, H), post, comb, layer_input)``."""
    return _ops.mhc_pre_broadcast(x, fn, hc_scale, hc_base, norm_weight, *cfg.scalars())


def hc_head(
    residual: Tensor, fn: Tensor, hc_scale: Tensor, hc_base: Tensor, cfg: MhcConfig = DEFAULT
) -> Tensor:
    """Final collapse: fn (n, n*H), hc_scale (1,), hc_base (n,) -> hidden (T, H) bf16."""
    return _ops.hc_head(residual, fn, hc_scale, hc_base, cfg.rms_eps, cfg.hc_eps)


def shard_rows(num_tokens: int, world_size: int) -> int:
    """Rows each rank owns of a sharded ``num_tokens``-row tensor: ``ceil(num_tokens / world_size)``
    (``shard_tokens``, ``reduce_scatter`` and the sharded stream of the fused ops)."""
    return -(-num_tokens // world_size)


def shard_tokens(x: Tensor, rank: int, world_size: int) -> Tensor:
    """Rank's rows of ``x`` after zero-padding dim 0 to a multiple of ``world_size``."""
    return _ops.shard_tokens(x, rank, world_size)


def all_gather(x: Tensor, group: GroupLike = None, num_tokens: int = -1) -> Tensor:
    """Concatenate every rank's ``x`` along dim 0; keep the first ``num_tokens`` rows (-1: all)."""
    return _ops.all_gather(x, group_name(group), num_tokens)


def reduce_scatter(x: Tensor, group: GroupLike = None) -> Tensor:
    """Sum ``x`` over the group (dim 0 zero-padded to a multiple of the world) and return this
    rank's ``ceil(T / world)`` rows."""
    return _ops.reduce_scatter(x, group_name(group))


def all_reduce(x: Tensor, group: GroupLike = None) -> Tensor:
    """Sum ``x`` over the group (out of place)."""
    return _ops.all_reduce(x, group_name(group))


def fused_entry(
    x: Tensor,
    fn: Tensor,
    hc_scale: Tensor,
    hc_base: Tensor,
    norm_weight: Optional[Tensor] = None,
    group: GroupLike = None,
    sharded: bool = True,
    cfg: MhcConfig = DEFAULT,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """First boundary. ``x`` is the replicated embedding output (T, H). Sharded: this rank's rows
    are broadcast into the stream and pre'd, and ``layer_input`` is all-gathered to (T, H).
    Returns ``(residual, post, comb, layer_input)``; the first three are this rank's shard."""
    return _ops.fused_entry(
        x, fn, hc_scale, hc_base, norm_weight, group_name(group), sharded, *cfg.scalars()
    )


def fused_layer(
    partial: Tensor,
    residual: Tensor,
    post: Tensor,
    comb: Tensor,
    fn: Tensor,
    hc_scale: Tensor,
    hc_base: Tensor,
    norm_weight: Optional[Tensor] = None,
    group: GroupLike = None,
    sharded: bool = True,
    num_tokens: int = -1,
    cfg: MhcConfig = DEFAULT,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A sublayer boundary: reduce ``partial`` (this rank's un-reduced (T, H) sublayer output),
    post it into the stream, pre the next sublayer (``norm_weight`` = its fused RMSNorm).

    Sharded: reduce-scatter, post+pre on this rank's ``ceil(num_tokens / world)`` rows, all-gather
    ``layer_input``. Not sharded: all-reduce and post+pre on every row. ``num_tokens`` = -1 means
    ``partial.shape[0]``. Returns
    ``(residual_out, post_out, comb_out, layer_input (num_tokens, H))``.
    """
    if num_tokens < 0:
        num_tokens = partial.shape[0]
    return _ops.fused_layer(
        partial,
        residual,
        post,
        comb,
        fn,
        hc_scale,
        hc_base,
        norm_weight,
        group_name(group),
        sharded,
        num_tokens,
        *cfg.scalars(),
    )


def fused_head(
    partial: Tensor,
    residual: Tensor,
    post: Tensor,
    comb: Tensor,
    head_fn: Tensor,
    head_scale: Tensor,
    head_base: Tensor,
    group: GroupLike = None,
    sharded: bool = True,
    num_tokens: int = -1,
    cfg: MhcConfig = DEFAULT,
) -> tuple[Tensor, Tensor]:
    """Last boundary: reduce, post, ``hc_head`` on this rank's rows, all-gather the hidden state.
    Returns ``(hidden (num_tokens, H), residual_out)``; ``residual_out`` (this rank's rows of the
    final stream) feeds the MTP layer."""
    if num_tokens < 0:
        num_tokens = partial.shape[0]
    return _ops.fused_head(
        partial,
        residual,
        post,
        comb,
        head_fn,
        head_scale,
        head_base,
        group_name(group),
        sharded,
        num_tokens,
        cfg.rms_eps,
        cfg.hc_eps,
    )
