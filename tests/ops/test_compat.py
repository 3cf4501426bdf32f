# SPDX-License-Identifier: Apache-2.0
"""mhc_sp.compat: the engines' call forms (vLLM's mHC ops, sglang / vLLM-CPU's hc_*_fused_cpu),
called with the engines' own conventions and compared with the torch reference and with the ops."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mhc_sp import compat, ops
from mhc_sp import reference as R
from mhc_sp.config import MhcConfig
from mhc_sp.testing import assert_close, random_inputs

CFG = MhcConfig()
LEAD = (2, 3)  # DeepSeek's [batch, seq] in front of (n, H)
N, H = 4, 64
S = (CFG.rms_eps, CFG.hc_pre_eps, CFG.hc_sinkhorn_eps, CFG.hc_post_mult, CFG.sinkhorn_iters)


@pytest.fixture(scope="module")
def i():
    """Inputs with the engines' shapes: streams (b, s, n, H), post (b, s, n, 1)."""
    flat = random_inputs(6, N, H, seed=11)
    v = dict(flat)
    v["residual"] = flat["residual"].view(*LEAD, N, H)
    v["x"] = flat["x"].view(*LEAD, H)
    v["post"] = flat["post"].view(*LEAD, N, 1)
    v["comb"] = flat["comb"].view(*LEAD, N, N)
    v["flat"] = flat
    return v


def strided(t: torch.Tensor) -> torch.Tensor:
    """t's values in a tensor whose last dim is a slice of a wider one (not viewable as rows)."""
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] + 8, dtype=t.dtype)
    wide[..., : t.shape[-1]] = t
    out = wide[..., : t.shape[-1]]
    assert not out.is_contiguous()
    return out


class CopyCounter(TorchDispatchMode):
    """Counts the aten copies (clone / copy_) an eager call makes."""

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (
            torch.ops.aten.clone,
            torch.ops.aten.copy_,
            torch.ops.aten._to_copy,
        ):
            self.copies += 1
        return func(*args, **(kwargs or {}))


# ---- vLLM ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", [False, True])
def test_vllm_mhc_pre(i, norm):
    w = i["norm_weight"] if norm else None
    post, comb, y = compat.mhc_pre(
        i["residual"],
        i["fn"],
        i["scale"],
        i["base"],
        *S,
        n_splits=4,
        norm_weight=w,
        norm_eps=CFG.norm_eps,
    )
    assert (post.shape, comb.shape, y.shape) == ((*LEAD, N, 1), (*LEAD, N, N), (*LEAD, H))
    f = i["flat"]
    exp = R.mhc_pre(f["residual"], f["fn"], f["scale"], f["base"], w, CFG)
    assert_close(post.reshape(-1, N), exp[0], "post")
    assert_close(comb.reshape(-1, N, N), exp[1], "comb")
    assert_close(y.reshape(-1, H), exp[2], "layer_input")
    same = ops.mhc_pre(f["residual"], f["fn"], f["scale"], f["base"], w, CFG)
    for a, b in zip((post, comb, y), same):  # the wrapper only reshapes
        assert torch.equal(a.reshape(b.shape), b)


def test_vllm_mhc_post_takes_post_as_returned_by_mhc_pre(i):
    out = compat.mhc_post(i["x"], i["residual"], i["post"], i["comb"])
    assert out.shape == (*LEAD, N, H)
    f = i["flat"]
    assert_close(out.reshape(-1, N, H), R.mhc_post(f["x"], f["residual"], f["post"], f["comb"]))
    flat_post = compat.mhc_post(i["x"], i["residual"], i["post"].squeeze(-1), i["comb"])
    assert torch.equal(out, flat_post)


@pytest.mark.parametrize("norm", [False, True])
def test_vllm_fused_post_pre_is_post_then_pre_bitwise(i, norm):
    w = i["norm_weight"] if norm else None
    got = compat.mhc_fused_post_pre(
        i["x"],
        i["residual"],
        i["post"],
        i["comb"],
        i["fn"],
        i["scale"],
        i["base"],
        *S,
        n_splits=2,
        tile_n=3,
        norm_weight=w,
        norm_eps=CFG.norm_eps,
    )
    residual = compat.mhc_post(i["x"], i["residual"], i["post"], i["comb"])
    expected = (
        residual,
        *compat.mhc_pre(
            residual, i["fn"], i["scale"], i["base"], *S, norm_weight=w, norm_eps=CFG.norm_eps
        ),
    )
    assert [t.shape for t in got] == [(*LEAD, N, H), (*LEAD, N, 1), (*LEAD, N, N), (*LEAD, H)]
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


@pytest.mark.parametrize("scale_shape", [(), (1,)])
def test_vllm_hc_head(i, scale_shape):
    out = compat.hc_head(
        i["residual"],
        i["head_fn"],
        i["head_scale"].reshape(scale_shape),
        i["head_base"],
        CFG.rms_eps,
        CFG.hc_eps,
    )
    assert out.shape == (*LEAD, H)
    f = i["flat"]
    exp = R.hc_head(f["residual"], f["head_fn"], f["head_scale"], f["head_base"], CFG)
    assert_close(out.reshape(-1, H), exp)


def test_strided_stream_is_copied_and_contiguous_one_is_not(i):
    res = strided(i["residual"])
    with CopyCounter() as contiguous_call:
        a = compat.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], *S)
    with CopyCounter() as strided_call:
        b = compat.mhc_pre(res, i["fn"], i["scale"], i["base"], *S)
    assert contiguous_call.copies == 0
    assert strided_call.copies == 1
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    # leading dims in another order: a transposed (s, b) stream is no view of (b*s) rows either
    swapped = i["residual"].transpose(0, 1).contiguous().transpose(0, 1)
    assert torch.equal(
        compat.mhc_post(i["x"], swapped, i["post"], i["comb"]),
        compat.mhc_post(i["x"], i["residual"], i["post"], i["comb"]),
    )
    assert torch.equal(
        compat.hc_head(
            strided(i["residual"]),
            i["head_fn"],
            i["head_scale"],
            i["head_base"],
            CFG.rms_eps,
            CFG.hc_eps,
        ),
        compat.hc_head(
            i["residual"], i["head_fn"], i["head_scale"], i["head_base"], CFG.rms_eps, CFG.hc_eps
        ),
    )


# ---- sglang / vLLM-CPU --------------------------------------------------------------------------


def test_sglang_hc_pre_fused_cpu(i):
    f = i["flat"]
    eps = 1e-5  # one eps for the pre weights and Sinkhorn
    y, post, comb = compat.hc_pre_fused_cpu(
        f["residual"], f["fn"], f["scale"], f["base"], N, 7, CFG.rms_eps, eps
    )
    assert (y.shape, post.shape, comb.shape) == ((6, H), (6, N), (6, N, N))
    cfg = MhcConfig(hc_pre_eps=eps, hc_sinkhorn_eps=eps, sinkhorn_iters=7, hc_post_mult=2.0)
    exp = R.mhc_pre(f["residual"], f["fn"], f["scale"], f["base"], None, cfg)
    for a, b, name in zip((post, comb, y), exp, ("post", "comb", "y")):
        assert_close(a, b, name)
    y4, _, _ = compat.hc_pre_fused_cpu(
        i["residual"], f["fn"], f["scale"], f["base"], N, 7, CFG.rms_eps, eps
    )
    assert torch.equal(y4, y.view(*LEAD, H))


def test_sglang_hc_post_fused_cpu(i):
    f = i["flat"]
    out = compat.hc_post_fused_cpu(f["x"], strided(f["residual"]), f["post"], f["comb"])
    assert torch.equal(out, ops.mhc_post(f["x"], f["residual"], f["post"], f["comb"]))
    assert_close(out, R.mhc_post(f["x"], f["residual"], f["post"], f["comb"]))


def test_sglang_hc_head_fused_cpu_takes_a_0d_scale(i):
    f = i["flat"]
    out = compat.hc_head_fused_cpu(
        f["residual"], f["head_fn"], f["head_scale"].reshape(()), f["head_base"], 1e-5, 1e-4
    )  # (hc_eps, norm_eps)
    exp = R.hc_head(
        f["residual"],
        f["head_fn"],
        f["head_scale"],
        f["head_base"],
        MhcConfig(rms_eps=1e-4, hc_eps=1e-5),
    )
    assert_close(out, exp)
    assert torch.equal(
        out,
        ops.hc_head(
            f["residual"],
            f["head_fn"],
            f["head_scale"],
            f["head_base"],
            MhcConfig(rms_eps=1e-4, hc_eps=1e-5),
        ),
    )


# ---- bad input keeps clear errors, named as the wrapper names its arguments --------------------


def test_wrong_dtypes(i):
    f = i["flat"]
    with pytest.raises(TypeError, match="^fn: expected dtype Float"):
        compat.mhc_pre(i["residual"], i["fn"].bfloat16(), i["scale"], i["base"], *S)
    with pytest.raises(TypeError, match="^residual: expected dtype BFloat16"):
        compat.mhc_pre(i["residual"].float(), i["fn"], i["scale"], i["base"], *S)
    with pytest.raises(TypeError, match="^post_layer_mix: expected dtype Float"):
        compat.mhc_post(i["x"], i["residual"], i["post"].bfloat16(), i["comb"])
    with pytest.raises(TypeError, match="^comb_res_mix: expected dtype Float"):
        compat.mhc_fused_post_pre(
            i["x"], i["residual"], i["post"], i["comb"].double(), i["fn"], i["scale"], i["base"], *S
        )
    with pytest.raises(TypeError, match="^hc_fn: expected dtype Float"):
        compat.hc_head_fused_cpu(
            f["residual"], f["head_fn"].half(), f["head_scale"], f["head_base"], 1e-6, 1e-6
        )
    with pytest.raises(TypeError, match="^hidden_states: expected dtype BFloat16"):
        compat.hc_head(
            i["residual"].half(), i["head_fn"], i["head_scale"], i["head_base"], 1e-6, 1e-6
        )
    with pytest.raises(TypeError, match="^x: expected a tensor"):
        compat.hc_pre_fused_cpu(None, f["fn"], f["scale"], f["base"], N, 20, 1e-6, 1e-6)


def test_mismatched_hc_mult(i):
    f = i["flat"]
    two = random_inputs(6, 2, H, seed=1)
    with pytest.raises(ValueError, match=r"^fn: expected size 8 at dim 0"):
        compat.mhc_pre(two["residual"], f["fn"], f["scale"], f["base"], *S)
    with pytest.raises(ValueError, match=r"^post_layer_mix: expected shape \(\.\.\., hc_mult, 1\)"):
        compat.mhc_post(i["x"], i["residual"], i["post"][..., :3, :], i["comb"])
    with pytest.raises(ValueError, match=r"^comb: expected shape"):
        compat.hc_post_fused_cpu(f["x"], f["residual"], f["post"], f["comb"][:, :3])
    with pytest.raises(ValueError, match=r"^hc_mult: expected the hc_mult dim of x \(4"):
        compat.hc_pre_fused_cpu(f["residual"], f["fn"], f["scale"], f["base"], 2, 20, 1e-6, 1e-6)
    with pytest.raises(ValueError, match=r"^hc_fn: expected size 4 at dim 0"):
        compat.hc_head_fused_cpu(
            f["residual"], f["fn"], f["head_scale"], f["head_base"], 1e-6, 1e-6
        )
    with pytest.raises(ValueError, match=r"^x: expected shape \(\.\.\., hidden\)"):
        compat.mhc_post(i["x"][:1], i["residual"], i["post"], i["comb"])


def test_wrong_devices(i):
    f = i["flat"]
    with pytest.raises(ValueError, match="^fn: expected a tensor on cpu"):
        compat.mhc_pre(i["residual"], i["fn"].to("meta"), i["scale"], i["base"], *S)
    with pytest.raises(ValueError, match="^hc_fn: expected a tensor on cpu"):
        compat.hc_head(
            i["residual"], i["head_fn"].to("meta"), i["head_scale"], i["head_base"], 1e-6, 1e-6
        )
    with pytest.raises(ValueError, match="^comb_res_mix: expected a tensor on cpu"):
        compat.mhc_post(i["x"], i["residual"], i["post"], i["comb"].to("meta"))
    with pytest.raises(ValueError, match="^hc_base: expected a tensor on cpu"):
        compat.hc_pre_fused_cpu(
            f["residual"], f["fn"], f["scale"], f["base"].to("meta"), N, 20, 1e-6, 1e-6
        )


def test_bad_scalars(i):
    with pytest.raises(ValueError, match="^sinkhorn_repeat: expected a positive int"):
        compat.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], *S[:4], 0)
    with pytest.raises(ValueError, match="^sinkhorn_repeat: expected a value in"):
        compat.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], *S[:4], 5000)
    with pytest.raises(ValueError, match="^n_splits: expected a positive int"):
        compat.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], *S, n_splits=0)
    with pytest.raises(ValueError, match="^rms_eps: expected a positive value"):
        compat.hc_head(i["residual"], i["head_fn"], i["head_scale"], i["head_base"], 0.0, 1e-6)
    with pytest.raises(ValueError, match=r"^residual: expected shape \(\.\.\., hc_mult, hidden\)"):
        compat.mhc_pre(i["residual"].reshape(-1), i["fn"], i["scale"], i["base"], *S)
