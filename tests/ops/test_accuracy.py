# SPDX-License-Identifier: Apache-2.0
"""Projection accuracy (docs/design.md §3b): against a float64 evaluation of the same math, the
CPU kernels' coefficients are no further off than those computed with torch's fp32 matmul of
the same bf16 stream (``mhc_sp.reference``), and their bf16 outputs miss the correctly rounded
value no more often."""

import torch

from mhc_sp import ops
from mhc_sp import reference as R
from mhc_sp.config import MhcConfig
from mhc_sp.testing import head_weights, random_inputs

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
