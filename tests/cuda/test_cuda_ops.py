# SPDX-License-Identifier: Apache-2.0
"""The five mHC math ops on CUDA against mhc_sp.reference (docs/design.md §1), the golden data, the
CPU kernels, torch.library.opcheck, CUDA-graph replay and mixed-device arguments.

Skipped as a whole on machines without a GPU (CPU CI compiles the CUDA code but cannot run it).
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("CUDA is not available", allow_module_level=True)

from mhc_sp import ops  # noqa: E402
from mhc_sp.testing import (  # noqa: E402
    OPS,
    assert_close,
    check_against_reference,
    check_compiled_chain,
    check_outputs,
    pre_weights,
    random_inputs,
)

DEV = "cuda"


def inputs(T, n, H, seed=None):
    return random_inputs(T, n, H, seed=T * 131 + n * 7 + H if seed is None else seed, device=DEV)


def to_device(d: dict, device) -> dict:
    return {k: v.to(device) for k, v in d.items()}


# T covers the fused single-launch path (<= 16 tokens), one partial 64-token tile (257 = 4 tiles
# + 1 token) and many tiles; H covers the 16-byte path (H % 8 == 0) and the scalar fallback.
SHAPES = [
    (1, 4, 4096),
    (1, 2, 7168),
    (5, 4, 1024),
    (5, 2, 33),
    (16, 4, 520),
    (16, 2, 100),
    (257, 4, 512),
    (257, 2, 77),
    (4096, 4, 256),
    (4096, 2, 40),
]


def check(name, i, norm=True):
    info = OPS[name]
    check_against_reference(info, info.sample(i, norm))


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("T,n,H", SHAPES)
@pytest.mark.parametrize("norm", [True, False])
def test_matches_reference(name, T, n, H, norm):
    check(name, inputs(T, n, H), norm)


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize(
    "T,n,H", [(3, 1, 64), (7, 3, 72), (20, 5, 48), (2, 6, 24), (9, 7, 16), (33, 8, 64), (17, 8, 7)]
)
def test_other_hc_mult(name, T, n, H):
    check(name, inputs(T, n, H))


@pytest.mark.parametrize("name", list(OPS))
def test_large_T(name):
    """More tokens than the finish grid holds, so blocks stride over token groups."""
    check(name, inputs(70001, 2, 16, seed=1))


@pytest.mark.parametrize("name", ["mhc_pre", "mhc_post_pre"])
def test_long_projection_per_block(name):
    """Enough 64-token tiles (266 at T = 17,000; from about 38 on 132 SMs) that plan_pre gives every
    block the most chunks a block takes, 32 (1,024 hidden positions of each of the 4 streams, a
    quarter of n*H = 16,384 values), and the finish adds the four blocks' subtrees: the
    tensor-core sums run through the deepest tree a block holds, and the accumulation must not
    drift over that long a chain."""
    check(name, inputs(17000, 4, 4096, seed=9))


@pytest.mark.parametrize("name", list(OPS))
def test_misaligned_pointers_use_scalar_path(name):
    """H % 8 == 0 but the bf16 tensors start 2 bytes past a 16-byte boundary."""
    i = inputs(9, 4, 64, seed=4)
    for k in ("residual", "x"):
        t = i[k]
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=DEV)
        i[k] = buf[1:].view(t.shape).copy_(t)
        assert i[k].data_ptr() % 16 != 0
    check(name, i)


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("T,n,H", [(5, 4, 520), (300, 4, 136), (1, 2, 33)])
def test_matches_cpu_kernels(name, T, n, H):
    """The CUDA and CPU kernels implement the same numerics (mhc_post_pre: see
    mhc_sp.testing.check_outputs)."""
    info = OPS[name]
    i = inputs(T, n, H)
    cpu_sample = info.sample(to_device(i, "cpu"))
    got = [t.cpu() for t in info.call(info.sample(i))]
    check_outputs(info, cpu_sample, got, info.call(cpu_sample))


@pytest.mark.parametrize("name", list(OPS))
def test_matches_golden(golden, name):
    """The in-repository golden data (tests/data), as on the CPU."""
    info = OPS[name]
    for case in golden["cases"]:
        for norm in (True, False) if info.takes_norm else (True,):
            expected = case["expected" if norm else "expected_no_norm"][name]
            cpu_sample = info.sample(case["inputs"], norm)
            got = [t.cpu() for t in info.call(info.sample(to_device(case["inputs"], DEV), norm))]
            check_outputs(info, cpu_sample, got, [expected[o] for o in info.outputs])


def test_post_pre_equals_post_then_pre():
    i = inputs(13, 4, 512, seed=5)
    fused = OPS["mhc_post_pre"].call(OPS["mhc_post_pre"].sample(i))
    residual = ops.mhc_post(i["x"], i["residual"], i["post"], i["comb"])
    assert torch.equal(fused[0], residual)
    for a, b in zip(fused[1:], ops.mhc_pre(residual, *pre_weights(i))):
        assert_close(a, b)


@pytest.mark.parametrize("name", list(OPS))
def test_deterministic(name):
    """Split-K partials are added in a fixed order: repeated calls agree bit for bit."""
    info = OPS[name]
    for T in (3, 300):
        sample = info.sample(inputs(T, 4, 1024, seed=6))
        for x, y in zip(info.call(sample), info.call(sample)):
            assert torch.equal(x, y)


# ---- torch.library / CUDA graphs / streams -------------------------------------------------


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("T", [6, 70])
def test_opcheck(name, T):
    info = OPS[name]
    sample = info.sample(inputs(T, 4, 128, seed=1))
    torch.library.opcheck(getattr(torch.ops.mhc_sp, name).default, info.schema_args(sample))


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("T", [1, 16, 257])
def test_cuda_graph_replay_bitwise_equal(name, T):
    info = OPS[name]
    op = getattr(torch.ops.mhc_sp, name).default
    args = info.schema_args(info.sample(inputs(T, 4, 1024, seed=7)))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture, as torch.cuda.graphs recommends
        op(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op(*args)
    captured = captured if isinstance(captured, tuple) else (captured,)
    eager = op(*args)
    eager = eager if isinstance(eager, tuple) else (eager,)
    for _ in range(3):
        for t in captured:
            t.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(captured, eager):
            assert torch.equal(a, b)


def test_runs_on_current_stream():
    """Work is ordered on the caller's stream: results produced on a side stream are complete
    once that stream is synchronised."""
    info = OPS["mhc_post_pre"]
    sample = info.sample(inputs(300, 4, 2048, seed=8))
    expected = info.call(sample)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = info.call(sample)
    side.synchronize()
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_compiled_chain_fullgraph():
    check_compiled_chain(inputs(11, 4, 256, seed=2))


# ---- mixed devices ---------------------------------------------------------------------------


def test_mixed_cpu_cuda_arguments_raise_value_error():
    i = inputs(4, 4, 64, seed=3)
    cpu = {k: v.cpu() for k, v in i.items()}
    cases = [
        ("fn", lambda: ops.mhc_pre(i["residual"], cpu["fn"], i["scale"], i["base"])),
        ("hc_scale", lambda: ops.mhc_pre(i["residual"], i["fn"], cpu["scale"], i["base"])),
        (
            "norm_weight",
            lambda: ops.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], cpu["norm_weight"]),
        ),
        ("x", lambda: ops.mhc_post(cpu["x"], i["residual"], i["post"], i["comb"])),
        ("comb", lambda: ops.mhc_post(i["x"], i["residual"], i["post"], cpu["comb"])),
        # residual fixes the device, so a CPU residual is reported through the first CUDA argument
        ("x", lambda: ops.mhc_post(i["x"], cpu["residual"], i["post"], i["comb"])),
        (
            "post",
            lambda: ops.mhc_post_pre(
                i["x"], i["residual"], cpu["post"], i["comb"], i["fn"], i["scale"], i["base"]
            ),
        ),
        ("hc_base", lambda: ops.mhc_pre_broadcast(i["x"], i["fn"], i["scale"], cpu["base"])),
        ("fn", lambda: ops.hc_head(i["residual"], cpu["head_fn"], i["head_scale"], i["head_base"])),
    ]
    for arg, call in cases:
        with pytest.raises(ValueError, match=f"^{arg}: expected a tensor on"):
            call()
