# SPDX-License-Identifier: Apache-2.0
"""Fake (meta) implementations of every mhc_sp op, so torch.compile / FakeTensor can trace them.

Shapes only; they mirror the C++ ops (csrc/) and docs/design.md §2. The collective ones need the
group's world size, which they read from the registered torch.distributed group.
"""

from __future__ import annotations

import torch
from torch.library import register_fake

from .distributed import world_size_of
from .ops import shard_rows


def _check_devices(**tensors):
    """Mixed devices reach the fake (Meta) kernel instead of a real one; refuse them as the C++
    checks do, naming the argument."""
    ref_name, ref = next(iter(tensors.items()))
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise ValueError(
                f"{name}: expected a tensor on {ref.device} (the device of {ref_name}), "
                f"got {t.device}"
            )


def _pre_outputs(residual_like: torch.Tensor, T, n, H):
    return (
        residual_like.new_empty((T, n), dtype=torch.float32),
        residual_like.new_empty((T, n, n), dtype=torch.float32),
        residual_like.new_empty((T, H), dtype=torch.bfloat16),
    )


@register_fake("mhc_sp::mhc_pre")
def _(residual, fn, hc_scale, hc_base, norm_weight, *scalars):
    _check_devices(
        residual=residual, fn=fn, hc_scale=hc_scale, hc_base=hc_base, norm_weight=norm_weight
    )
    T, n, H = residual.shape
    return _pre_outputs(residual, T, n, H)


@register_fake("mhc_sp::mhc_post")
def _(x, residual, post, comb):
    _check_devices(residual=residual, x=x, post=post, comb=comb)
    return torch.empty_like(residual)


@register_fake("mhc_sp::mhc_post_pre")
def _(x, residual, post, comb, fn, hc_scale, hc_base, norm_weight, *scalars):
    _check_devices(
        residual=residual,
        x=x,
        post=post,
        comb=comb,
        fn=fn,
        hc_scale=hc_scale,
        hc_base=hc_base,
        norm_weight=norm_weight,
    )
    T, n, H = residual.shape
    return (torch.empty_like(residual), *_pre_outputs(residual, T, n, H))


@register_fake("mhc_sp::mhc_pre_broadcast")
def _(x, fn, hc_scale, hc_base, norm_weight, *scalars):
    _check_devices(x=x, fn=fn, hc_scale=hc_scale, hc_base=hc_base, norm_weight=norm_weight)
    T, H = x.shape
    n = fn.shape[1] // H
    return (x.new_empty((T, n, H)), *_pre_outputs(x, T, n, H))


@register_fake("mhc_sp::hc_head")
def _(residual, fn, hc_scale, hc_base, rms_eps, hc_eps):
    _check_devices(residual=residual, fn=fn, hc_scale=hc_scale, hc_base=hc_base)
    T, n, H = residual.shape
    return residual.new_empty((T, H))


@register_fake("mhc_sp::shard_tokens")
def _(x, rank, world_size):
    return x.new_empty((shard_rows(x.shape[0], world_size), *x.shape[1:]))


@register_fake("mhc_sp::all_gather")
def _(x, group, num_tokens):
    rows = x.shape[0] * world_size_of(group)
    return x.new_empty((rows if num_tokens < 0 else num_tokens, *x.shape[1:]))


@register_fake("mhc_sp::reduce_scatter")
def _(x, group):
    return x.new_empty((shard_rows(x.shape[0], world_size_of(group)), *x.shape[1:]))


@register_fake("mhc_sp::all_reduce")
def _(x, group):
    return torch.empty_like(x)


@register_fake("mhc_sp::fused_entry")
def _(x, fn, hc_scale, hc_base, norm_weight, group, sharded, *scalars):
    T, H = x.shape
    n = fn.shape[1] // H
    rows = shard_rows(T, world_size_of(group)) if sharded else T
    post, comb, _unused = _pre_outputs(x, rows, n, H)
    return x.new_empty((rows, n, H)), post, comb, x.new_empty((T, H))


@register_fake("mhc_sp::fused_layer")
def _(
    partial,
    residual,
    post,
    comb,
    fn,
    hc_scale,
    hc_base,
    norm_weight,
    group,
    sharded,
    num_tokens,
    *scalars,
):
    rows, n, H = residual.shape
    post_out, comb_out, _unused = _pre_outputs(residual, rows, n, H)
    return torch.empty_like(residual), post_out, comb_out, residual.new_empty((num_tokens, H))


@register_fake("mhc_sp::fused_head")
def _(
    partial,
    residual,
    post,
    comb,
    head_fn,
    head_scale,
    head_base,
    group,
    sharded,
    num_tokens,
    rms_eps,
    hc_eps,
):
    H = residual.shape[2]
    return residual.new_empty((num_tokens, H)), torch.empty_like(residual)
