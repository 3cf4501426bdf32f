# SPDX-License-Identifier: Apache-2.0
"""Plain-PyTorch reference of the mHC math and of the sequence-parallel flow (docs/design.md).

Readable rather than fast: tests and benchmarks both compare against it. All arithmetic is fp32;
bf16 appears only where the contract rounds (stream tensors, layer_input). The SP functions
simulate a whole TP group in one process: they take and return one tensor per rank. Each math
function takes its arguments the way its ``mhc_sp.ops`` wrapper does.
"""

from __future__ import annotations

import torch

from .config import MhcConfig

DEFAULT = MhcConfig()


def _rms_scale(X: torch.Tensor, eps: float) -> torch.Tensor:
    """rsqrt(mean(X^2) + eps) over the last dim, keepdim."""
    return torch.rsqrt(X.square().mean(-1, keepdim=True) + eps)


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """softmax over j (+eps), normalise columns, then (iters - 1) x (rows, columns). (..., n, n)."""
    c = logits.softmax(-1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim: bf16 in, bf16 out, fp32 math (the ops' fused norm; the model's
    final norm uses it too)."""
    y = x.float()
    scale = torch.rsqrt(y.square().mean(-1, keepdim=True) + eps)
    return (y * scale * weight.float()).to(torch.bfloat16)


def mhc_pre(residual, fn, hc_scale, hc_base, norm_weight=None, cfg: MhcConfig = DEFAULT):
    """residual (T, n, H) bf16 -> post (T, n) fp32, comb (T, n, n) fp32, layer_input (T, H) bf16."""
    T, n, H = residual.shape
    X = residual.float().reshape(T, n * H)
    mix = (X @ fn.float().t()) * _rms_scale(X, cfg.rms_eps)
    s, b = hc_scale.float(), hc_base.float()
    pre = torch.sigmoid(mix[:, :n] * s[0] + b[:n]) + cfg.hc_pre_eps
    post = torch.sigmoid(mix[:, n : 2 * n] * s[1] + b[n : 2 * n]) * cfg.hc_post_mult
    logits = (mix[:, 2 * n :] * s[2] + b[2 * n :]).reshape(T, n, n)
    comb = sinkhorn(logits, cfg.sinkhorn_iters, cfg.hc_sinkhorn_eps)
    layer_input = (pre.unsqueeze(-1) * residual.float()).sum(1).to(torch.bfloat16)
    if norm_weight is not None:
        layer_input = rms_norm(layer_input, norm_weight, cfg.norm_eps)
    return post, comb, layer_input


def mhc_post(x, residual, post, comb):
    """out[t,j] = post[t,j] x[t] + sum_i comb[t,i,j] residual[t,i]  (T, n, H) bf16."""
    mixed = torch.einsum("tij,tih->tjh", comb.float(), residual.float())
    return (post.float().unsqueeze(-1) * x.float().unsqueeze(1) + mixed).to(torch.bfloat16)


def mhc_post_pre(
    x, residual, post, comb, fn, hc_scale, hc_base, norm_weight=None, cfg: MhcConfig = DEFAULT
):
    """mhc_post, then mhc_pre on its bf16 output: (residual_out, post, comb, layer_input)."""
    residual_out = mhc_post(x, residual, post, comb)
    return (residual_out, *mhc_pre(residual_out, fn, hc_scale, hc_base, norm_weight, cfg))


def mhc_pre_broadcast(x, fn, hc_scale, hc_base, norm_weight=None, cfg: MhcConfig = DEFAULT):
    """First layer: x (T, H) copied into n streams, then mhc_pre."""
    n = fn.shape[1] // x.shape[1]
    residual = x.unsqueeze(1).expand(x.shape[0], n, x.shape[1]).contiguous()
    return (residual, *mhc_pre(residual, fn, hc_scale, hc_base, norm_weight, cfg))


def hc_head(residual, fn, hc_scale, hc_base, cfg: MhcConfig = DEFAULT):
    """Final collapse of the n streams into one hidden state (T, H) bf16."""
    T, n, H = residual.shape
    X = residual.float().reshape(T, n * H)
    mix = (X @ fn.float().t()) * _rms_scale(X, cfg.rms_eps)
    w = torch.sigmoid(mix * hc_scale.float()[0] + hc_base.float()) + cfg.hc_eps
    return (w.unsqueeze(-1) * residual.float()).sum(1).to(torch.bfloat16)


# ---- sequence-parallel flow (one tensor per rank) -------------------------------------------


def shard_tokens(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Zero-pad dim 0 to a multiple of world_size and return rank's rows."""
    rows = -(-x.shape[0] // world_size)  # written out: the reference leans on nothing it checks
    padded = x.new_zeros((rows * world_size, *x.shape[1:]))
    padded[: x.shape[0]] = x
    return padded[rank * rows : (rank + 1) * rows].clone()


def sum_partials(partials: list[torch.Tensor]) -> torch.Tensor:
    """The ranks' tensors summed in fp32 (fp64 for fp64) in rank order 0, 1, ..., starting from
    +0, rounded once to their dtype. From +0: a position where every rank holds -0 sums to +0."""
    acc_type = torch.float64 if partials[0].dtype == torch.float64 else torch.float32
    total = torch.zeros(partials[0].shape, dtype=acc_type, device=partials[0].device)
    for p in partials:
        total = total + p.to(acc_type)
    return total.to(partials[0].dtype)


def reduce_scatter(partials: list[torch.Tensor]) -> list[torch.Tensor]:
    """Sum the ranks' tensors (``sum_partials``), zero-pad, and give each rank its rows."""
    total = sum_partials(partials)
    return [shard_tokens(total, r, len(partials)) for r in range(len(partials))]


def all_reduce(partials: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every rank gets the whole ``sum_partials``."""
    total = sum_partials(partials)
    return [total.clone() for _ in partials]


def all_gather(shards: list[torch.Tensor], num_tokens: int = -1) -> torch.Tensor:
    """Concatenate the ranks' shards along dim 0 and keep the first num_tokens rows (-1: all)."""
    full = torch.cat(shards, 0)
    return full if num_tokens < 0 else full[:num_tokens]


def zero_padding(t: torch.Tensor, rank: int, num_tokens: int) -> torch.Tensor:
    """rank's shard ``t`` with its rows at or past num_tokens (the stream's padding) set to zero."""
    valid = max(0, min(t.shape[0], num_tokens - rank * t.shape[0]))
    out = t.clone()
    out[valid:] = 0
    return out


def fused_entry(
    x, fn, hc_scale, hc_base, norm_weight, world_size: int, sharded: bool, cfg: MhcConfig = DEFAULT
):
    """Per rank: (residual, post, comb, layer_input). x is the replicated embedding output."""
    if not sharded:
        return [mhc_pre_broadcast(x, fn, hc_scale, hc_base, norm_weight, cfg)] * world_size
    outs = [
        mhc_pre_broadcast(shard_tokens(x, r, world_size), fn, hc_scale, hc_base, norm_weight, cfg)
        for r in range(world_size)
    ]
    layer_input = all_gather([o[3] for o in outs], x.shape[0])
    return [
        (*(zero_padding(t, r, x.shape[0]) for t in o[:3]), layer_input) for r, o in enumerate(outs)
    ]


def _reduce(partials, sharded: bool, num_tokens: int):
    """Rows past num_tokens of a partial are ignored, so the stream's padding rows stay zero."""
    partials = [p[:num_tokens] for p in partials]
    return reduce_scatter(partials) if sharded else all_reduce(partials)


def fused_layer(
    partials,
    residuals,
    posts,
    combs,
    fn,
    hc_scale,
    hc_base,
    norm_weight,
    sharded: bool,
    num_tokens: int,
    cfg: MhcConfig = DEFAULT,
):
    """One sublayer boundary for every rank. partials: each rank's un-reduced (T, H) output;
    residuals/posts/combs: each rank's stream (its shard when sharded, everything otherwise).
    Returns per rank (residual_out, post_out, comb_out, layer_input (num_tokens, H))."""
    xs = _reduce(partials, sharded, num_tokens)
    outs = [
        mhc_post_pre(x, res, p, c, fn, hc_scale, hc_base, norm_weight, cfg)
        for x, res, p, c in zip(xs, residuals, posts, combs)
    ]
    if sharded:
        layer_input = all_gather([o[3] for o in outs], num_tokens)
        return [
            (*(zero_padding(t, r, num_tokens) for t in o[:3]), layer_input)
            for r, o in enumerate(outs)
        ]
    return [(*o[:3], o[3][:num_tokens]) for o in outs]


def fused_head(
    partials,
    residuals,
    posts,
    combs,
    head_fn,
    head_scale,
    head_base,
    sharded: bool,
    num_tokens: int,
    rms_eps: float = DEFAULT.rms_eps,
    hc_eps: float = DEFAULT.hc_eps,
):
    """Per rank: (hidden (num_tokens, H), residual_out) - the final post, then hc_head."""
    xs = _reduce(partials, sharded, num_tokens)
    streams = [mhc_post(x, res, p, c) for x, res, p, c in zip(xs, residuals, posts, combs)]
    if sharded:
        streams = [zero_padding(s, r, num_tokens) for r, s in enumerate(streams)]
    cfg = DEFAULT.replace(rms_eps=rms_eps, hc_eps=hc_eps)
    hidden = [hc_head(s, head_fn, head_scale, head_base, cfg) for s in streams]
    gathered = all_gather(hidden, num_tokens) if sharded else None
    return [((gathered if sharded else h[:num_tokens]), s) for h, s in zip(hidden, streams)]
