# SPDX-License-Identifier: Apache-2.0
"""The five mHC math ops on CPU against mhc_sp.reference and the golden data (docs/design.md §1)."""

import inspect

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mhc_sp import ops
from mhc_sp.config import MhcConfig
from mhc_sp.testing import (
    BF16_TOL,
    OPS,
    assert_close,
    check_against_reference,
    check_compiled_chain,
    check_outputs,
    pre_weights,
    random_inputs,
)

CFG = MhcConfig()
PRE_FAMILY = [name for name, info in OPS.items() if info.takes_norm]


# ---- golden data -----------------------------------------------------------------------------


def test_golden_constants_are_v4_defaults(golden):
    assert golden["constants"] == {k: getattr(CFG, k) for k in golden["constants"]}
    assert set(golden["constants"]) >= {
        "rms_eps",
        "hc_pre_eps",
        "hc_sinkhorn_eps",
        "hc_post_mult",
        "sinkhorn_iters",
        "norm_eps",
        "hc_eps",
    }


def test_golden_file_is_what_its_generator_makes(golden_module):
    """The committed file equals a fresh float64 build, bit for bit."""
    fresh = golden_module.build()
    stored = torch.load(golden_module.PATH, weights_only=True)
    assert golden_module.differences(fresh, stored) == []


def test_golden_covers_the_shapes_it_promises(golden):
    shapes = {(c["T"], c["n"], c["H"]) for c in golden["cases"]}
    assert {(1, 4, 4096), (2, 4, 7168)} <= shapes, "V4-Flash and V4-Pro hidden sizes"
    assert {0, 1} <= {T for T, _, _ in shapes}
    assert {1, 2, 3, 4, 8} <= {n for _, n, _ in shapes}
    assert any(H % 2 for _, _, H in shapes)
    for case in golden["cases"]:
        T, n, H = case["T"], case["n"], case["H"]
        assert case["inputs"]["residual"].shape == (T, n, H)
        assert case["inputs"]["fn"].dtype == torch.float32
        for name, info in OPS.items():
            assert set(case["expected"][name]) == set(info.outputs), name


@pytest.mark.parametrize("impl", ["reference", "cpu_op"])
@pytest.mark.parametrize("name", list(OPS))
def test_matches_golden(golden, impl, name):
    info = OPS[name]
    call = info.call_reference if impl == "reference" else info.call
    for case in golden["cases"]:
        for norm in (True, False) if info.takes_norm else (True,):
            expected = case["expected" if norm else "expected_no_norm"][name]
            sample = info.sample(case["inputs"], norm)
            got = call(sample)
            check_outputs(info, sample, got, [expected[o] for o in info.outputs])
            if name == "mhc_post_pre":  # even where a stream value moved by one ulp
                torch.testing.assert_close(got[2], expected["comb"], rtol=0, atol=1e-4)


def test_external_golden(external_golden, golden_module):
    """A golden file from elsewhere (MHC_SP_GOLDEN): the ops, and the float64 math the in-repo
    data is made with, both agree with it."""
    keys = {
        "mhc_pre": ("post", "comb", "layer_input"),
        "mhc_post_pre": ("residual", "post", "comb", "layer_input"),
        "mhc_pre_broadcast": ("residual", "post", "comb", "layer_input"),
    }
    for case in external_golden["cases"]:
        i = case["inputs"]
        ours = golden_module.expected_outputs(i, norm=True)
        for name, info in OPS.items():
            g = case[name]
            expected = [g[k] for k in keys[name]] if name in keys else [g]
            sample = info.sample(i)
            check_outputs(info, sample, info.call(sample), expected)
            check_outputs(info, sample, [ours[name][o] for o in info.outputs], expected)
        no_norm = OPS["mhc_pre"].sample(i, norm=False)
        assert_close(OPS["mhc_pre"].call(no_norm)[2], case["mhc_pre"]["layer_input_no_norm"])


# ---- against the reference -------------------------------------------------------------------

SHAPES = [
    (0, 4, 256),
    (1, 4, 4096),
    (3, 2, 64),
    (17, 4, 1024),
    (5, 4, 100),
    (9, 3, 72),
    (2, 8, 48),
    (4, 1, 33),
]


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("T,n,H", SHAPES)
@pytest.mark.parametrize("norm", [True, False])
def test_matches_reference(name, T, n, H, norm):
    info = OPS[name]
    check_against_reference(info, info.sample_inputs(T, n, H, seed=T * 131 + n * 7 + H, norm=norm))


def test_post_pre_equals_post_then_pre():
    i = random_inputs(13, 4, 512, seed=5)
    fused = OPS["mhc_post_pre"].call(OPS["mhc_post_pre"].sample(i))
    residual = ops.mhc_post(i["x"], i["residual"], i["post"], i["comb"])
    assert torch.equal(fused[0], residual)
    separate = ops.mhc_pre(residual, *pre_weights(i))
    for a, b in zip(fused[1:], separate):
        assert_close(a, b)


@pytest.mark.parametrize("T", [1, 4, 37])  # hidden split across threads (T <= 4), token blocks
def test_results_do_not_depend_on_thread_count(T):
    i = random_inputs(T, 4, 1040, seed=9)
    samples = {name: info.sample(i) for name, info in OPS.items()}
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = {name: OPS[name].call(s) for name, s in samples.items()}
        torch.set_num_threads(max(2, threads))
        many = {name: OPS[name].call(s) for name, s in samples.items()}
    finally:
        torch.set_num_threads(threads)
    for name in OPS:
        for x, y in zip(one[name], many[name]):
            assert torch.equal(x, y), name


# ---- fuzzing (examples per test: the hypothesis profile in conftest.py) ----------------------


@pytest.mark.parametrize("name", list(OPS))
@given(
    T=st.integers(0, 300),
    h_blocks=st.integers(1, 64),
    n=st.sampled_from([2, 4]),
    norm=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_fuzz_against_reference(name, T, h_blocks, n, norm, seed):
    info = OPS[name]
    check_against_reference(info, info.sample_inputs(T, n, 64 * h_blocks, seed=seed, norm=norm))


# ---- torch.library / torch.compile -----------------------------------------------------------


@pytest.mark.parametrize(
    "name,norm",
    [
        (name, norm)
        for name, info in OPS.items()
        for norm in ((True, False) if info.takes_norm else (True,))
    ],
)
def test_opcheck(name, norm):
    info = OPS[name]
    sample = info.sample_inputs(6, 4, 128, seed=1, norm=norm)
    torch.library.opcheck(getattr(torch.ops.mhc_sp, name).default, info.schema_args(sample))


def test_compiled_chain_fullgraph():
    check_compiled_chain(random_inputs(11, 4, 256, seed=2))


# ---- NaN -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mhc_post", "mhc_post_pre"])
def test_nan_propagates_like_reference(name):
    i = random_inputs(3, 4, 40, seed=4)  # H=40: the 16-wide vector path and the scalar tail
    i["x"][1, 5] = float("nan")
    i["x"][2, 37] = float("nan")
    sample = OPS[name].sample(i)
    got, expected = OPS[name].call(sample)[0], OPS[name].call_reference(sample)[0]
    assert torch.isnan(got).any()
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    assert not torch.isinf(got).any()


@pytest.mark.parametrize("name", ["mhc_post", "mhc_post_pre"])
def test_nan_coefficients_with_any_payload_stay_nan(name):
    # Payloads whose low bits would carry into the sign or exponent under the bf16 rounding add.
    payloads = torch.tensor([0x7FFFFFFF, 0x7F800001, -1], dtype=torch.int32).view(torch.float32)
    i = random_inputs(3, 4, 40, seed=5)
    i["post"][0, 1] = payloads[0]
    i["comb"][1, 2, 3] = payloads[1]
    i["comb"][2, 0, 0] = payloads[2]
    sample = OPS[name].sample(i)
    got, expected = OPS[name].call(sample)[0], OPS[name].call_reference(sample)[0]
    assert torch.isnan(got).any()
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    assert not torch.isinf(got).any()
    finite = ~torch.isnan(expected)
    torch.testing.assert_close(got[finite], expected[finite], **BF16_TOL)


# ---- the registry itself -----------------------------------------------------------------------


def test_registry_follows_the_schemas():
    """Wrapper and reference take the same arguments, named as in the schema (plus ``cfg`` for
    the scalar tail); outputs are named as the schema names them."""
    for name, info in OPS.items():
        schema = getattr(torch.ops.mhc_sp, name).default._schema
        op_params = list(inspect.signature(info.op).parameters)
        assert info.op is getattr(ops, name)
        assert list(inspect.signature(info.reference).parameters) == op_params, name
        k = len(info.arg_keys)
        assert op_params[:k] == [a.name for a in schema.arguments[:k]], name
        assert op_params[k:] == (["cfg"] if info.scalars else []), name
        assert [r.name or o for r, o in zip(schema.returns, info.outputs)] == list(info.outputs)
        assert len(schema.returns) == len(info.outputs), name
        sample = info.sample_inputs(2, 4, 64)
        assert len(info.schema_args(sample)) == len(schema.arguments), name


def test_bytes_moved_counts_every_argument_and_output_once():
    T, n, H, M = 3, 4, 64, 24
    stream, hidden, coeffs = 2 * T * n * H, 2 * T * H, 4 * T * n + 4 * T * n * n
    fn, pre_weights, norm = 4 * M * n * H, 4 * 3 + 4 * M, 2 * H
    head = 4 * n * n * H + 4 + 4 * n
    expected = {
        "mhc_pre": stream + fn + pre_weights + norm + coeffs + hidden,
        "mhc_post": hidden + stream + coeffs + stream,
        "mhc_post_pre": (
            hidden + stream + coeffs + fn + pre_weights + norm + stream + coeffs + hidden
        ),
        "mhc_pre_broadcast": hidden + fn + pre_weights + norm + stream + coeffs + hidden,
        "hc_head": stream + head + hidden,
    }
    i = random_inputs(T, n, H)
    for name, info in OPS.items():
        assert info.bytes_moved(info.sample(i)) == expected[name], name
    no_norm = OPS["mhc_pre"].sample(i, norm=False)
    assert OPS["mhc_pre"].bytes_moved(no_norm) == expected["mhc_pre"] - norm
