# SPDX-License-Identifier: Apache-2.0
"""Batch invariance and projection accuracy of the CUDA math ops (docs/design.md §3b): a token's
outputs are bitwise the same whatever else shares its call (which changes the token tiles, the
split of H over blocks, fused or separate finish) and whatever the vector width the pointers
allow; the projection's coefficients are within the error of a correct fp32 tensor-core sum in the
kernel's order, against float64 (tests/helpers/projection_bounds.py).

Skipped as a whole on machines without a GPU; bench/gpu_check.sh runs it.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("CUDA is not available", allow_module_level=True)

from mhc_sp import ops  # noqa: E402
from mhc_sp.testing import OPS, random_inputs  # noqa: E402
from tests.helpers.projection_bounds import (  # noqa: E402
    cuda_projection_depths,
    error_ratios,
    error_scales,
)

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


def test_projection_error_is_within_a_correct_tensor_core_sums():
    """Against float64 directly (the bounds: tests/helpers/projection_bounds.py): every post and
    comb value within the first-order worst-case error of a correct fp32 sum in the kernel's order,
    and their errors in rms within the typical error of one. Not "no worse than torch's fp32
    matmul": the tensor cores' own rounding may lose that comparison call by call without any
    defect."""
    for T, H in [(2048, 7168), (64, 4096), (48, 2048), (1, 4096)]:
        i = random_inputs(T, 4, H, seed=T + H, device=DEV)
        args = (i["residual"], i["fn"], i["scale"], i["base"])
        exact, scales = error_scales(*args, cuda_projection_depths(4, H))
        post, comb, _ = ops.mhc_pre(*args)
        ratios = error_ratios({"post": post, "comb": comb}, exact, scales)
        for k, (worst, typical) in ratios.items():
            assert worst <= 1, f"T={T} H={H} {k}: an error {worst:.3g} x the worst-case bound"
            assert typical <= 1, f"T={T} H={H} {k}: rms error {typical:.3g} x the typical one"
