# SPDX-License-Identifier: Apache-2.0
"""Batch invariance and projection accuracy of the CUDA math ops (docs/design.md §3b): a token's
outputs are bitwise the same whatever else shares its call (which changes the token tiles, the
split of H over blocks, fused or separate finish) and whatever the vector width the pointers
allow; the projection is no further from float64 than torch's fp32 matmul on the GPU.

Skipped as a whole on machines without a GPU; bench/gpu_check.sh runs it.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("CUDA is not available", allow_module_level=True)

from mhc_sp import ops  # noqa: E402
from mhc_sp import reference as R  # noqa: E402
from mhc_sp.testing import OPS, random_inputs  # noqa: E402

DEV = "cuda"
TOKENS = [*range(1, 41), 255, 256, 257, 1000]
PER_TOKEN = ("residual", "x", "post", "comb")


def first_rows(inputs: dict, T: int) -> dict:
    return {k: (v[:T] if k in PER_TOKEN else v) for k, v in inputs.items()}


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t whose data starts 2 bytes past a 16-byte boundary: the kernels then
    take their one-value-at-a-time path."""
    buf = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
    out = buf[1 : 1 + t.numel()].view(t.shape)
    out.copy_(t)
    assert out.data_ptr() % 16 != 0 and out.is_contiguous()
    return out


# H = 4096: the 16-byte path; H = 1003: the one-value path and a partial last chunk.
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("H", [4096, 1003])
def test_rows_do_not_depend_on_the_call(name, H):
    info = OPS[name]
    inputs = random_inputs(max(TOKENS), 4, H, seed=H, device=DEV)
    full = info.call(info.sample(inputs))
    for T in TOKENS:
        got = info.call(info.sample(first_rows(inputs, T)))
        for out_name, a, b in zip(info.outputs, got, full):
            assert torch.equal(a, b[:T]), f"{name}.{out_name}: T={T} rows differ from the full call"


@pytest.mark.parametrize("name", list(OPS))
def test_vector_width_does_not_change_results(name):
    info = OPS[name]
    inputs = random_inputs(37, 4, 2048, seed=5, device=DEV)
    aligned = info.call(info.sample(inputs))
    shifted = info.call(
        info.sample({k: (misaligned(v) if k in PER_TOKEN else v) for k, v in inputs.items()})
    )
    for out_name, a, b in zip(info.outputs, aligned, shifted):
        assert torch.equal(a, b), f"{name}.{out_name}"


def float64_coefficients(residual, fn, scale, base, cfg=R.DEFAULT):
    T, n, H = residual.shape
    X = residual.double().reshape(T, n * H)
    mix = (X @ fn.double().t()) * torch.rsqrt(X.square().mean(-1, keepdim=True) + cfg.rms_eps)
    s, b = scale.double(), base.double()
    post = torch.sigmoid(mix[:, n : 2 * n] * s[1] + b[n : 2 * n]) * cfg.hc_post_mult
    logits = (mix[:, 2 * n :] * s[2] + b[2 * n :]).reshape(T, n, n)
    return post, R.sinkhorn(logits, cfg.sinkhorn_iters, cfg.hc_sinkhorn_eps)


def test_projection_error_is_at_most_torch_matmul_error():
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's fp32 matmul, not TF32
    try:
        errors = {"post": [[], []], "comb": [[], []]}
        for T, H in [(2048, 7168), (64, 4096), (48, 2048), (1, 4096)]:
            i = random_inputs(T, 4, H, seed=T + H, device=DEV)
            exact = float64_coefficients(i["residual"], i["fn"], i["scale"], i["base"])
            ours = ops.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"])
            fp32 = R.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"])
            for k, e, a, b in zip(("post", "comb"), exact, ours, fp32):
                errors[k][0].append((a.double() - e).abs().flatten())
                errors[k][1].append((b.double() - e).abs().flatten())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    for k, (ours, fp32) in errors.items():
        ours, fp32 = torch.cat(ours), torch.cat(fp32)
        rms = [v.square().mean().sqrt().item() for v in (ours, fp32)]
        assert rms[0] <= 1.1 * rms[1], f"{k}: rms error {rms[0]:.3g} vs torch {rms[1]:.3g}"
        assert ours.max() <= 1.1 * fp32.max(), f"{k}: max {ours.max():.3g} vs {fp32.max():.3g}"
