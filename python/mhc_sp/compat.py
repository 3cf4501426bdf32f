# SPDX-License-Identifier: Apache-2.0
"""The engines' own call forms of the mHC ops, as thin wrappers over ``torch.ops.mhc_sp``.

- vLLM's mHC ops: ``mhc_pre``, ``mhc_post``, ``mhc_fused_post_pre``, ``hc_head``. Streams carry any
  leading dims (``(..., n, H)``, e.g. DeepSeek's ``[b, s, n, H]``) and ``post`` is ``(..., n, 1)``.
- sglang's CPU kernels, which vLLM's CPU backend vendors: ``hc_pre_fused_cpu``,
  ``hc_post_fused_cpu``, ``hc_head_fused_cpu`` (post multiplier 2, one ``hc_eps`` for the pre
  weights and Sinkhorn, as there).

Names, argument names, defaults and return shapes are the engines'; the math is mhc_sp's (fp32,
batch-invariant: docs/design.md §1, §3b), on whatever device the tensors are. A strided stream is
copied only when it cannot be viewed as contiguous rows; a 0-d ``hc_scale`` is accepted where the
engines pass one. What is still wrong (dtypes, a mismatched hc_mult, tensors on different devices)
raises the ops' TypeError/ValueError, named after the wrapper's argument.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = [
    "mhc_pre",
    "mhc_post",
    "mhc_fused_post_pre",
    "hc_head",
    "hc_pre_fused_cpu",
    "hc_post_fused_cpu",
    "hc_head_fused_cpu",
]

_ops = torch.ops.mhc_sp
_SGLANG_POST_MULT = 2.0  # fixed in sglang's CPU kernels
_UNUSED_NORM_EPS = 1e-6  # passed when there is no norm_weight: the op then never reads it


def _tensor(t, name: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    return t


def _contiguous(t: Tensor, shape) -> Tensor:
    """t as contiguous rows of `shape`: a view whenever the strides allow one."""
    t = t.reshape(shape)
    return t if t.is_contiguous() else t.contiguous()


def _stream(t, name: str) -> tuple[Tensor, torch.Size]:
    """A stream (..., n, H) as contiguous (T, n, H), and its leading dims."""
    t = _tensor(t, name)
    if t.dim() < 2:
        raise ValueError(f"{name}: expected shape (..., hc_mult, hidden), got {tuple(t.shape)}")
    return _contiguous(t, (-1, *t.shape[-2:])), t.shape[:-2]


def _rows(t, name: str, lead: torch.Size, tails: tuple, layout: str) -> Tensor:
    """A per-token tensor of shape lead + one of `tails` (the first as documented, the last the
    kernel's) as contiguous (T, *tails[-1])."""
    t = _tensor(t, name)
    if tuple(t.shape) not in [tuple(lead) + tail for tail in tails]:
        raise ValueError(
            f"{name}: expected shape {layout} = {tuple(lead) + tails[0]}, got {tuple(t.shape)}"
        )
    return _contiguous(t, (-1, *tails[-1]))


def _scale(t, name: str) -> Tensor:
    """hc_scale, with a 0-d tensor read as (1,)."""
    t = _tensor(t, name)
    return t.reshape(1) if t.dim() == 0 else t


def _count(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: expected a positive int, got {v!r}")
    return v


def _call(op, renames: dict, *args):
    """op(*args), with an error's leading argument name given as the wrapper spells it."""
    try:
        return op(*args)
    except (TypeError, ValueError) as e:
        name, sep, rest = str(e).partition(":")
        if sep and name in renames:
            raise type(e)(renames[name] + sep + rest) from None
        raise


_VLLM_POST = {"post": "post_layer_mix", "comb": "comb_res_mix", "sinkhorn_iters": "sinkhorn_repeat"}


def _vllm_post_inputs(x, post_layer_mix, comb_res_mix, lead, n: int, H: int) -> tuple:
    """vLLM's post inputs ``x (..., H)``, ``post_layer_mix (..., n, 1)``, ``comb_res_mix
    (..., n, n)`` as the op's contiguous (T, H), (T, n), (T, n, n)."""
    return (
        _rows(x, "x", lead, ((H,),), "(..., hidden)"),
        _rows(post_layer_mix, "post_layer_mix", lead, ((n, 1), (n,)), "(..., hc_mult, 1)"),
        _rows(comb_res_mix, "comb_res_mix", lead, ((n, n),), "(..., hc_mult, hc_mult)"),
    )


def _vllm_scalars(
    rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, norm_weight, norm_eps
) -> tuple:
    """vLLM's pre constants as the op's scalar tail (after ``norm_weight``)."""
    iters = _count(sinkhorn_repeat, "sinkhorn_repeat")
    norm_eps = norm_eps if norm_weight is not None else _UNUSED_NORM_EPS
    return rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, iters, norm_eps


# ---- vLLM ---------------------------------------------------------------------------------------


def mhc_pre(
    residual: Tensor,
    fn: Tensor,
    hc_scale: Tensor,
    hc_base: Tensor,
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    n_splits: int = 1,
    norm_weight: Optional[Tensor] = None,
    norm_eps: float = 1e-6,
) -> tuple[Tensor, Tensor, Tensor]:
    """vLLM ``mhc_pre``: residual (..., n, H) bf16 -> ``(post_mix (..., n, 1), comb_mix
    (..., n, n), layer_input (..., H))``. ``n_splits`` is vLLM's split-K hint; mhc_sp's result
    never depends on how its work is split, so it is checked and otherwise unused."""
    r, lead = _stream(residual, "residual")
    _count(n_splits, "n_splits")
    n, H = r.shape[1:]
    pre = (rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat)
    scalars = _vllm_scalars(*pre, norm_weight, norm_eps)
    weights = (fn, hc_scale, hc_base, norm_weight)
    post, comb, y = _call(_ops.mhc_pre, _VLLM_POST, r, *weights, *scalars)
    return post.view(*lead, n, 1), comb.view(*lead, n, n), y.view(*lead, H)


def mhc_post(x: Tensor, residual: Tensor, post_layer_mix: Tensor, comb_res_mix: Tensor) -> Tensor:
    """vLLM ``mhc_post``: ``out[..., j, :] = post_layer_mix[..., j] * x
    + sum_i comb_res_mix[..., i, j] * residual[..., i, :]``, (..., n, H) bf16. post_layer_mix is
    (..., n, 1) (or (..., n))."""
    r, lead = _stream(residual, "residual")
    n, H = r.shape[1:]
    x, post, comb = _vllm_post_inputs(x, post_layer_mix, comb_res_mix, lead, n, H)
    out = _call(_ops.mhc_post, _VLLM_POST, x, r, post, comb)
    return out.view(*lead, n, H)


def mhc_fused_post_pre(
    x: Tensor,
    residual: Tensor,
    post_layer_mix: Tensor,
    comb_res_mix: Tensor,
    fn: Tensor,
    hc_scale: Tensor,
    hc_base: Tensor,
    rms_eps: float,
    hc_pre_eps: float,
    hc_sinkhorn_eps: float,
    hc_post_mult_value: float,
    sinkhorn_repeat: int,
    n_splits: int = 1,
    tile_n: int = 1,
    norm_weight: Optional[Tensor] = None,
    norm_eps: float = 1e-6,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """vLLM ``mhc_fused_post_pre``: ``mhc_post`` then ``mhc_pre`` of its output, in one pass.
    Returns ``(residual_cur (..., n, H), post_mix_cur (..., n, 1), comb_mix_cur (..., n, n),
    layer_input_cur (..., H))``. ``n_splits`` and ``tile_n`` are vLLM's tiling hints (unused)."""
    r, lead = _stream(residual, "residual")
    _count(n_splits, "n_splits")
    _count(tile_n, "tile_n")
    n, H = r.shape[1:]
    x, post, comb = _vllm_post_inputs(x, post_layer_mix, comb_res_mix, lead, n, H)
    pre = (rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat)
    scalars = _vllm_scalars(*pre, norm_weight, norm_eps)
    weights = (fn, hc_scale, hc_base, norm_weight)
    out, post, comb, y = _call(_ops.mhc_post_pre, _VLLM_POST, x, r, post, comb, *weights, *scalars)
    return out.view(*lead, n, H), post.view(*lead, n, 1), comb.view(*lead, n, n), y.view(*lead, H)


def hc_head(
    hidden_states: Tensor,
    hc_fn: Tensor,
    hc_scale: Tensor,
    hc_base: Tensor,
    rms_norm_eps: float,
    hc_eps: float,
) -> Tensor:
    """vLLM ``hc_head``: the final collapse of hidden_states (..., n, H) into (..., H) bf16;
    hc_fn (n, n*H), hc_scale (1,) or 0-d, hc_base (n,)."""
    r, lead = _stream(hidden_states, "hidden_states")
    out = _call(
        _ops.hc_head,
        {"residual": "hidden_states", "fn": "hc_fn"},
        r,
        hc_fn,
        _scale(hc_scale, "hc_scale"),
        hc_base,
        rms_norm_eps,
        hc_eps,
    )
    return out.view(*lead, r.shape[2])


# ---- sglang / vLLM-CPU --------------------------------------------------------------------------

_SGLANG = {"residual": "x", "fn": "hc_fn"}


def hc_pre_fused_cpu(
    x: Tensor,
    hc_fn: Tensor,
    hc_scale: Tensor,
    hc_base: Tensor,
    hc_mult: int,
    sinkhorn_iters: int,
    rms_eps: float,
    hc_eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """sglang ``hc_pre_fused_cpu``: x (..., n, H) bf16 -> ``(y (..., H), post (..., n),
    comb (..., n, n))``; ``hc_eps`` is both the pre weights' and Sinkhorn's eps."""
    r, lead = _stream(x, "x")
    n, H = r.shape[1:]
    if hc_mult != n:
        raise ValueError(
            f"hc_mult: expected the hc_mult dim of x ({n}, shape {tuple(x.shape)}), got {hc_mult!r}"
        )
    iters = _count(sinkhorn_iters, "sinkhorn_iters")
    post, comb, y = _call(
        _ops.mhc_pre,
        _SGLANG,
        r,
        hc_fn,
        hc_scale,
        hc_base,
        None,
        rms_eps,
        hc_eps,
        hc_eps,
        _SGLANG_POST_MULT,
        iters,
        _UNUSED_NORM_EPS,
    )
    return y.view(*lead, H), post.view(*lead, n), comb.view(*lead, n, n)


def hc_post_fused_cpu(x: Tensor, residual: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    """sglang ``hc_post_fused_cpu``: x (..., H), residual (..., n, H), post (..., n),
    comb (..., n, n) -> (..., n, H) bf16."""
    r, lead = _stream(residual, "residual")
    n, H = r.shape[1:]
    out = _ops.mhc_post(
        _rows(x, "x", lead, ((H,),), "(..., hidden)"),
        r,
        _rows(post, "post", lead, ((n,),), "(..., hc_mult)"),
        _rows(comb, "comb", lead, ((n, n),), "(..., hc_mult, hc_mult)"),
    )
    return out.view(*lead, n, H)


def hc_head_fused_cpu(
    x: Tensor, hc_fn: Tensor, hc_scale: Tensor, hc_base: Tensor, hc_eps: float, norm_eps: float
) -> Tensor:
    """sglang ``hc_head_fused_cpu``: x (..., n, H) -> (..., H) bf16; ``norm_eps`` is the RMS eps
    of the weights' normalisation, hc_scale a 0-d or (1,) tensor."""
    r, lead = _stream(x, "x")
    out = _call(
        _ops.hc_head, _SGLANG, r, hc_fn, _scale(hc_scale, "hc_scale"), hc_base, norm_eps, hc_eps
    )
    return out.view(*lead, r.shape[2])
