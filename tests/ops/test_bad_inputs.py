# SPDX-License-Identifier: Apache-2.0
"""Bad arguments raise a Python exception naming the argument (docs/design.md §2), never crash."""

import pytest
import torch

from mhc_sp import MhcConfig, ops
from mhc_sp.testing import random_inputs


@pytest.fixture
def i():
    return random_inputs(4, 4, 64, seed=3)


def expect(exc, match, fn):
    with pytest.raises(exc, match=match):
        fn()


def test_wrong_dtype(i):
    expect(
        TypeError,
        "^residual: expected dtype BFloat16",
        lambda: ops.mhc_pre(i["residual"].float(), i["fn"], i["scale"], i["base"]),
    )
    expect(
        TypeError,
        "^fn: expected dtype Float",
        lambda: ops.mhc_pre(i["residual"], i["fn"].half(), i["scale"], i["base"]),
    )
    expect(
        TypeError,
        "^x: expected dtype BFloat16",
        lambda: ops.mhc_post(i["x"].float(), i["residual"], i["post"], i["comb"]),
    )
    expect(
        TypeError,
        "^comb: expected dtype Float",
        lambda: ops.mhc_post(i["x"], i["residual"], i["post"], i["comb"].double()),
    )
    expect(
        TypeError,
        "^norm_weight: expected dtype bfloat16 or float32",
        lambda: ops.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], i["norm_weight"].half()),
    )


def test_wrong_rank(i):
    expect(
        ValueError,
        r"^residual: expected a 3-d tensor",
        lambda: ops.mhc_pre(i["residual"][0], i["fn"], i["scale"], i["base"]),
    )
    expect(
        ValueError,
        r"^post: expected a 2-d tensor",
        lambda: ops.mhc_post(i["x"], i["residual"], i["post"][0], i["comb"]),
    )
    expect(
        ValueError,
        r"^x: expected a 2-d tensor",
        lambda: ops.mhc_pre_broadcast(i["x"][0], i["fn"], i["scale"], i["base"]),
    )


def test_non_contiguous(i):
    res_t = i["residual"].transpose(0, 1).contiguous().transpose(0, 1)
    expect(
        ValueError,
        "^residual: expected a contiguous tensor",
        lambda: ops.mhc_post(i["x"], res_t, i["post"], i["comb"]),
    )
    fn_t = i["fn"].t().contiguous().t()
    expect(
        ValueError,
        "^fn: expected a contiguous tensor",
        lambda: ops.mhc_pre(i["residual"], fn_t, i["scale"], i["base"]),
    )


def test_wrong_device(i):
    # Mixed cpu/meta arguments go to the fake kernel, which checks devices like the C++ ops do.
    expect(
        ValueError,
        "^fn: expected a tensor on cpu",
        lambda: ops.mhc_pre(i["residual"], i["fn"].to("meta"), i["scale"], i["base"]),
    )
    expect(
        ValueError,
        "^comb: expected a tensor on cpu",
        lambda: ops.mhc_post(i["x"], i["residual"], i["post"], i["comb"].to("meta")),
    )


def test_fn_rows_not_n_times_n_plus_2(i):
    expect(
        ValueError,
        r"^fn: expected size 24 at dim 0 \(n\*\(n\+2\)",
        lambda: ops.mhc_pre(i["residual"], i["fn"][:20].contiguous(), i["scale"], i["base"]),
    )
    expect(
        ValueError,
        r"^hc_base: expected size 24",
        lambda: ops.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"][:20]),
    )
    expect(
        ValueError,
        r"^fn: expected size 4 at dim 0",
        lambda: ops.hc_head(i["residual"], i["fn"], i["head_scale"], i["head_base"]),
    )
    expect(
        ValueError,
        r"^fn: expected shape \(n\*\(n\+2\), n\*64\)",
        lambda: ops.mhc_pre_broadcast(i["x"], i["fn"][:, :100].contiguous(), i["scale"], i["base"]),
    )


def test_sizes_disagree_between_arguments(i):
    expect(
        ValueError,
        r"^x: expected size 4 at dim 0 \(tokens\)",
        lambda: ops.mhc_post(i["x"][:3], i["residual"], i["post"], i["comb"]),
    )
    expect(
        ValueError,
        r"^post: expected size 4 at dim 0",
        lambda: ops.mhc_post(i["x"], i["residual"], i["post"][:3], i["comb"]),
    )
    expect(
        ValueError,
        r"^comb: expected size 4 at dim 2",
        lambda: ops.mhc_post(i["x"], i["residual"], i["post"], i["comb"][:, :, :3].contiguous()),
    )
    expect(
        ValueError,
        r"^x: expected size 64 at dim 1 \(hidden\)",
        lambda: ops.mhc_post(i["x"][:, :32].contiguous(), i["residual"], i["post"], i["comb"]),
    )
    expect(
        ValueError,
        r"^fn: expected size 128 at dim 1 \(hc_mult \* hidden\)",
        lambda: ops.mhc_pre(i["residual"][:, :, :32].contiguous(), i["fn"], i["scale"], i["base"]),
    )
    expect(
        ValueError,
        r"^hc_scale: expected size 3",
        lambda: ops.mhc_pre(i["residual"], i["fn"], i["scale"][:2], i["base"]),
    )


def test_norm_weight_wrong_size(i):
    expect(
        ValueError,
        r"^norm_weight: expected size 64 at dim 0 \(hidden\)",
        lambda: ops.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], i["norm_weight"][:5]),
    )
    expect(
        ValueError,
        r"^norm_weight: expected size 64",
        lambda: ops.mhc_post_pre(
            *(i[k] for k in ("x", "residual", "post", "comb", "fn", "scale", "base")),
            torch.ones(65),
        ),
    )


def test_hc_mult_out_of_range():
    expect(
        ValueError,
        r"^residual: hc_mult \(dim 1\) must be in \[1, 8\]",
        lambda: ops.mhc_post(
            torch.zeros(2, 8, dtype=torch.bfloat16),
            torch.zeros(2, 9, 8, dtype=torch.bfloat16),
            torch.zeros(2, 9),
            torch.zeros(2, 9, 9),
        ),
    )


def test_bad_scalars(i):
    S = MhcConfig().scalars()
    bad_iters = (*S[:4], 0, S[5])
    expect(
        ValueError,
        "^sinkhorn_iters",
        lambda: torch.ops.mhc_sp.mhc_pre(
            i["residual"], i["fn"], i["scale"], i["base"], None, *bad_iters
        ),
    )
    bad_eps = (0.0, *S[1:])
    expect(
        ValueError,
        "^rms_eps",
        lambda: torch.ops.mhc_sp.mhc_pre(
            i["residual"], i["fn"], i["scale"], i["base"], None, *bad_eps
        ),
    )
    expect(ValueError, "sinkhorn_iters", lambda: MhcConfig(sinkhorn_iters=0))
    expect(ValueError, "hc_mult", lambda: MhcConfig(hc_mult=9))


def test_none_for_a_required_tensor(i):
    expect(
        ValueError,
        "^residual: expected a tensor, got None",
        lambda: torch.ops.mhc_sp.mhc_post(i["x"], None, i["post"], i["comb"]),
    )


def test_from_hf_config():
    cfg = MhcConfig.from_hf_config(
        {"hc_mult": 2, "hc_sinkhorn_iters": 7, "hc_eps": 1e-5, "rms_norm_eps": 1e-5}
    )
    assert (cfg.hc_mult, cfg.sinkhorn_iters, cfg.hc_pre_eps, cfg.hc_sinkhorn_eps, cfg.hc_eps) == (
        2,
        7,
        1e-5,
        1e-5,
        1e-5,
    )
    assert (cfg.rms_eps, cfg.norm_eps, cfg.hc_post_mult) == (1e-5, 1e-5, 2.0)
    assert MhcConfig.from_hf_config({}) == MhcConfig()
