# SPDX-License-Identifier: Apache-2.0
"""Projection accuracy (docs/design.md §3b), against a float64 evaluation of the same math.

CPU: the kernels' coefficients are no further off than those computed with torch's fp32 matmul of
the same bf16 stream (``mhc_sp.reference``), and their bf16 outputs miss the correctly rounded
value no more often.

CUDA: the projection runs on the tensor cores, whose accumulation is not IEEE fp32, so "no worse
than torch" is not a promise a correct kernel can keep call by call. Its coefficients are held
instead to the error that a correct fp32 sum in the kernel's own order can make
(tests/helpers/projection_bounds.py): every post and comb value within the first-order
worst-case bound, and their errors in rms within the typical error of such a sum.
tests/cuda/test_cuda_invariance.py applies both to the CUDA kernels; here a model of a
tensor-core sum in that order (:func:`tensor_core_projection`) shows what meets them: a sum that
keeps 20 or more bits where the tensor cores align their products (fp32 keeps 24) passes with
room, while one that keeps 18, or drops the low part of fn's three-way bf16 split, or rounds fn
to bf16, fails."""

import pytest
import torch

from mhc_sp import ops
from mhc_sp import reference as R
from mhc_sp.config import MhcConfig
from mhc_sp.testing import head_weights, random_inputs
from tests.helpers.projection_bounds import (
    cuda_projection_depths,
    error_ratios,
    error_scales,
    float64_coefficients,
)

CFG = MhcConfig()
# The golden data's shapes, V4-Flash and V4-Pro hidden sizes, and decode.
SHAPES = [(5, 512), (33, 1024), (48, 2048), (64, 4096), (64, 7168), (1, 4096), (3, 7168)]
MARGIN = 1.1


def float64_pre(residual, fn, scale, base):
    """post, comb, and the collapse y (no norm) in float64."""
    T, n, H = residual.shape
    X = residual.double().reshape(T, n * H)
    mix = (X @ fn.double().t()) * torch.rsqrt(X.square().mean(-1, keepdim=True) + CFG.rms_eps)
    s, b = scale.double(), base.double()
    pre = torch.sigmoid(mix[:, :n] * s[0] + b[:n]) + CFG.hc_pre_eps
    post = torch.sigmoid(mix[:, n : 2 * n] * s[1] + b[n : 2 * n]) * CFG.hc_post_mult
    logits = (mix[:, 2 * n :] * s[2] + b[2 * n :]).reshape(T, n, n)
    comb = R.sinkhorn(logits, CFG.sinkhorn_iters, CFG.hc_sinkhorn_eps)
    return post, comb, (pre.unsqueeze(-1) * residual.double()).sum(1)


def float64_head(residual, fn, scale, base):
    T, n, H = residual.shape
    X = residual.double().reshape(T, n * H)
    mix = (X @ fn.double().t()) * torch.rsqrt(X.square().mean(-1, keepdim=True) + CFG.rms_eps)
    w = torch.sigmoid(mix * scale.double()[0] + base.double()) + CFG.hc_eps
    return (w.unsqueeze(-1) * residual.double()).sum(1)


def test_projection_error_is_at_most_torch_matmul_error():
    errors = {k: {"ours": [], "torch": []} for k in ("post", "comb")}
    misses = {k: {"ours": 0, "torch": 0} for k in ("layer_input", "hidden")}
    values = {"layer_input": 0, "hidden": 0}
    for T, H in SHAPES:
        i = random_inputs(T, 4, H, seed=T * 7 + H)
        exact = float64_pre(i["residual"], i["fn"], i["scale"], i["base"])
        ours = ops.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"])
        fp32 = R.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"])
        for k, e, a, b in zip(("post", "comb"), exact, ours, fp32):
            errors[k]["ours"].append((a.double() - e).abs().flatten())
            errors[k]["torch"].append((b.double() - e).abs().flatten())
        rounded = exact[2].to(torch.bfloat16)
        misses["layer_input"]["ours"] += int((ours[2] != rounded).sum())
        misses["layer_input"]["torch"] += int((fp32[2] != rounded).sum())
        values["layer_input"] += rounded.numel()

        head = (i["residual"], *head_weights(i))
        rounded = float64_head(*head).to(torch.bfloat16)
        misses["hidden"]["ours"] += int((ops.hc_head(*head) != rounded).sum())
        misses["hidden"]["torch"] += int((R.hc_head(*head) != rounded).sum())
        values["hidden"] += rounded.numel()

    for k, e in errors.items():
        ours, fp32 = torch.cat(e["ours"]), torch.cat(e["torch"])
        rms_ours, rms_torch = ours.square().mean().sqrt().item(), fp32.square().mean().sqrt().item()
        assert rms_ours <= MARGIN * rms_torch, f"{k}: rms {rms_ours:.3g} vs torch {rms_torch:.3g}"
        assert ours.max() <= MARGIN * fp32.max(), f"{k}: max {ours.max():.3g} vs {fp32.max():.3g}"
    for k, m in misses.items():
        # a few misses either way are rounding luck: allow 1 in 10^4 values beyond the margin
        slack = values[k] // 10_000
        assert m["ours"] <= MARGIN * m["torch"] + slack, (
            f"{k}: {m['ours']} of {values[k]} values not correctly rounded vs {m['torch']} (torch)"
        )


# ---- the CUDA projection's error bound: a model of the tensor cores ---------------------------


def pairwise_fp32(v: torch.Tensor) -> torch.Tensor:
    """v summed over its last dim in fp32, pairwise (a tree of depth ceil(log2(len)))."""
    while v.shape[-1] > 1:
        pairs = v[..., 0 : v.shape[-1] // 2 * 2 : 2] + v[..., 1::2][..., : v.shape[-1] // 2]
        v = torch.cat([pairs, v[..., -1:]], -1) if v.shape[-1] % 2 else pairs
    return v[..., 0]


def tensor_core_projection(residual, fn, scale, base, bits=24, fn_parts=3):
    """post and comb (fp32) with the projection summed in the CUDA kernel's order by a model of the
    tensor cores: fn split into fn_parts bf16 parts (hi, mid, lo, as split_bf16x3), each 16-product
    dot product of a part from zero with every product exact, then truncated toward zero to `bits`
    bits below the group's largest product (its alignment), summed exactly and the sum truncated
    to fp32; the parts' dot products added in fp32, hi + (mid + lo), then k-step by k-step into the
    chunk's leaf and the leaves pairwise (cuda_projection_depths). The squares: a chunk's in
    sequence, then pairwise; coefficients in fp32."""
    T, n, H = residual.shape
    hc = max(16, (128 // n) // 16 * 16)
    chunks = -(-H // hc)

    def steps(t):  # (..., n, H) -> (..., chunks, n * hc / 16, 16), zero-padded past H
        t = torch.nn.functional.pad(t, (0, chunks * hc - H))
        t = t.reshape(*t.shape[:-2], n, chunks, hc // 16, 16).transpose(-4, -3)
        return t.reshape(*t.shape[:-4], chunks, n * hc // 16, 16)

    w = fn.float().reshape(-1, n, H)
    parts, rest = [], w
    for _ in range(fn_parts):
        part = rest.to(torch.bfloat16).float()
        parts.append(steps(part.double()))
        rest = rest - part
    mixes, squares = [], []
    for t0 in range(0, T, 4):  # a few tokens at a time: the products are (tokens, M, n * H)
        x = steps(residual[t0 : t0 + 4].double())
        dots = []
        for part in parts:
            prod = x.unsqueeze(1) * part.unsqueeze(0)
            top = prod.abs().amax(-1, keepdim=True).clamp_min(1e-300)
            quantum = torch.exp2(torch.floor(torch.log2(top)) - (bits - 1))
            exact_sum = (torch.trunc(prod / quantum) * quantum).sum(-1)
            f = exact_sum.float()  # rounded to nearest; one step toward zero where it went up
            up = f.double().abs() > exact_sum.abs()
            dots.append(torch.where(up, torch.nextafter(f, torch.zeros_like(f)), f))
        step = dots[0]  # hi + (mid + lo), as the kernel adds them
        if len(dots) == 3:
            step = dots[0] + (dots[1] + dots[2])
        elif len(dots) == 2:
            step = dots[0] + dots[1]
        leaf = torch.zeros(step.shape[:-1])
        for k in range(step.shape[-1]):
            leaf = leaf + step[..., k]
        mixes.append(pairwise_fp32(leaf))
        sq = x.float().square().reshape(x.shape[0], chunks, -1)
        acc = torch.zeros(sq.shape[:-1])
        for k in range(sq.shape[-1]):
            acc = acc + sq[..., k]
        squares.append(pairwise_fp32(acc))
    inv_rms = 1.0 / torch.sqrt(torch.cat(squares) / (n * H) + CFG.rms_eps)
    mix = torch.cat(mixes) * inv_rms.unsqueeze(-1)
    post, comb = float64_coefficients(mix, scale.float(), base.float(), n)
    return {"post": post, "comb": comb}


MODEL_SHAPES = [(8, 512), (16, 2048), (8, 7168)]


@pytest.fixture(scope="module")
def model_cases():
    cases = []
    for T, H in MODEL_SHAPES:
        i = random_inputs(T, 4, H, seed=T + H)
        args = (i["residual"], i["fn"], i["scale"], i["base"])
        cases.append((args, *error_scales(*args, cuda_projection_depths(4, H))))
    return cases


def worst_ratios(model_cases, **model) -> dict[str, tuple[float, float]]:
    """The largest of each ratio over the shapes, for tensor_core_projection(**model)."""
    out = {"post": (0.0, 0.0), "comb": (0.0, 0.0)}
    for args, exact, scales in model_cases:
        got = error_ratios(tensor_core_projection(*args, **model), exact, scales)
        out = {k: tuple(max(a, b) for a, b in zip(out[k], got[k])) for k in out}
    return out


@pytest.mark.parametrize("bits", [24, 22, 20])
def test_a_correct_tensor_core_sum_meets_the_cuda_bounds(model_cases, bits):
    ratios = worst_ratios(model_cases, bits=bits)
    for k, (worst, typical) in ratios.items():
        assert worst <= 1 and typical <= 1, (k, worst, typical)
    if bits == 24:  # a sum as precise as fp32 is well inside them
        assert all(typical < 0.3 for _, typical in ratios.values()), ratios


@pytest.mark.parametrize(
    "model", [{"bits": 18}, {"fn_parts": 2}, {"fn_parts": 1}], ids=["18_bits", "no_lo", "bf16_fn"]
)
def test_the_cuda_bounds_catch_a_projection_that_keeps_fewer_bits(model_cases, model):
    ratios = worst_ratios(model_cases, **model)
    assert any(worst > 1 or typical > 1 for worst, typical in ratios.values()), ratios


def test_cuda_projection_depths_follow_the_kernel_plan():
    # hc_mult 4: 32 hidden positions per chunk (128 staged values, 8 dot products of 16)
    assert cuda_projection_depths(4, 7168) == (34 + 2 + 8 + 8, 32 + 2 + 8)  # 224 chunks
    assert cuda_projection_depths(4, 32) == (34 + 2 + 8, 32 + 2)  # one chunk
    assert cuda_projection_depths(2, 4096) == (34 + 2 + 8 + 6, 32 + 2 + 6)  # 64 per chunk
