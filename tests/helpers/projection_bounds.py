# SPDX-License-Identifier: Apache-2.0
"""The error a correct fp32 sum in the CUDA projection's own order can make (docs/design.md §3b):
the projection runs on the tensor cores, whose accumulation is not IEEE fp32, so the CUDA
kernels' post and comb are held to these bounds instead of to torch's matmul. error_scales gives,
for every value, the first-order worst-case bound and the typical (rms) error of such a sum from
the roundings on its longest path (cuda_projection_depths); error_ratios says how far a result
is from them (at most 1 for a correct projection). tests/ops/test_accuracy.py shows what meets
them; tests/cuda/test_cuda_invariance.py holds the CUDA kernels to them."""

import math

import torch

from mhc_sp import reference as R
from mhc_sp.config import MhcConfig

CFG = MhcConfig()

U = 2.0**-24  # fp32's unit roundoff
# The fp32 evaluation of the coefficients from the projection (sigmoid, the softmax and Sinkhorn
# iterations, mhc_sp/detail/coefficients.h), in units of U * |value|: evaluating the float64 mix
# in fp32 misses by at most 4.3 (post) and 16.9 (comb), rms 0.73 and 2.3 (2048 tokens, seed 5); the
# bounds allow twice the largest and about the rms.
EVAL_WORST = {"post": 8.0, "comb": 32.0}
EVAL_TYPICAL = {"post": 1.0, "comb": 3.0}


def cuda_projection_depths(n: int, H: int) -> tuple[int, int]:
    """Roundings on the longest path of one mix value and of the sum of squares in the CUDA
    projection (csrc/cuda/device/pre.cuh, mhc_pre with hc_mult n): per chunk of HC hidden
    positions of every stream, KC / 16 tensor-core dot products of 16 values each, from zero; each
    is a 16-term sum inside the tensor core, whose own (not IEEE) rounding is counted as 2 x 17
    roundings; then hi + (mid + lo) (2), then added one after another into the chunk's leaf
    (KC / 16), then the leaves pairwise (ceil(log2(chunks)), the blocks' split included). The
    squares: each lane adds 4 per dot product in sequence (4 KC / 16), the four lanes of a row
    combine (2), then the same tree."""
    hc = max(16, (128 // n) // 16 * 16)
    steps = n * hc // 16
    chunks = -(-H // hc)
    levels = math.ceil(math.log2(chunks)) if chunks > 1 else 0
    return 2 * 17 + 2 + steps + levels, 4 * steps + 2 + levels


def float64_coefficients(mix, scale, base, n):
    """post and comb of the projection `mix` (already times the inverse rms), in mix's dtype."""
    post = torch.sigmoid(mix[:, n : 2 * n] * scale[1] + base[n : 2 * n]) * CFG.hc_post_mult
    logits = (mix[:, 2 * n :] * scale[2] + base[2 * n :]).reshape(-1, n, n)
    return post, R.sinkhorn(logits, CFG.sinkhorn_iters, CFG.hc_sinkhorn_eps)


def error_scales(residual, fn, scale, base, depths):
    """The float64 post and comb of mhc_pre, and for each value the worst-case and the typical
    error of a correct computation whose projection rounds as `depths` (mix, squares) says.

    For a mix value m = r * sum_k x_k w_k (r the inverse rms) summed with d roundings on its
    longest path, to first order |error| <= U * (d * r * sum_k |x_k w_k| + d_r * |m|), where the
    inverse rms, from a sum of positive squares with d_sq roundings, is off by at most
    d_r = d_sq / 2 + 3 units. Typically the roundings are independent and add in quadrature:
    U * (2 sqrt(d) * r * sqrt(sum_k (x_k w_k)^2) + sqrt(d_sq) * |m|), the 2 for the tensor cores'
    truncation. Both go through the coefficients' first derivatives (post: the sigmoid's; comb: the
    Jacobian of Sinkhorn in its logits, by autograd in float64), then the fp32 evaluation of the
    coefficients is added (EVAL_WORST to the worst case; EVAL_TYPICAL in quadrature)."""
    T, n, H = residual.shape
    d_mix, d_sq = depths
    X = residual.double().reshape(T, n * H)
    W = fn.double()
    r = torch.rsqrt(X.square().mean(-1, keepdim=True) + CFG.rms_eps)
    mix = (X @ W.t()) * r
    s, b = scale.double(), base.double()
    post, comb = float64_coefficients(mix, s, b, n)
    per_mix = {
        "worst": U * (d_mix * r * (X.abs() @ W.abs().t()) + (d_sq / 2 + 3) * mix.abs()),
        "typical": U
        * (2 * math.sqrt(d_mix) * r * (X.square() @ W.square().t()).sqrt() + d_sq**0.5 * mix.abs()),
    }
    sig = torch.sigmoid(mix[:, n : 2 * n] * s[1] + b[n : 2 * n])
    d_post = (CFG.hc_post_mult * sig * (1 - sig) * s[1]).abs()
    logits = (mix[:, 2 * n :] * s[2] + b[2 * n :]).reshape(T, n * n)

    def comb_of(flat):
        c = R.sinkhorn(flat.reshape(n, n), CFG.sinkhorn_iters, CFG.hc_sinkhorn_eps)
        return c.reshape(n * n)

    d_comb = torch.vmap(torch.func.jacrev(comb_of))(logits).abs() * s[2].abs()  # (T, nn, nn)
    scales = {}
    for kind, e in per_mix.items():
        p = d_post * e[:, n : 2 * n]
        c = (d_comb @ e[:, 2 * n :].unsqueeze(-1)).reshape(T, n, n)
        if kind == "worst":
            p = p + EVAL_WORST["post"] * U * post.abs()
            c = c + EVAL_WORST["comb"] * U * comb.abs()
        else:
            p = torch.hypot(p, EVAL_TYPICAL["post"] * U * post.abs())
            c = torch.hypot(c, EVAL_TYPICAL["comb"] * U * comb.abs())
        scales[kind] = {"post": p, "comb": c}
    return {"post": post, "comb": comb}, scales


def error_ratios(got, exact, scales) -> dict[str, tuple[float, float]]:
    """{coefficient: (largest error / its worst-case bound, rms of error / its typical error)};
    both at most 1 for a correct projection."""
    out = {}
    for k in ("post", "comb"):
        err = (got[k].double().to(exact[k].device) - exact[k]).abs()
        worst = float((err / scales["worst"][k]).max())
        typical = float((err / scales["typical"][k]).square().mean().sqrt())
        out[k] = (worst, typical)
    return out
