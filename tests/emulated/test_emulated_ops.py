# SPDX-License-Identifier: Apache-2.0
"""The five CUDA math ops, run on the emulated device (mhc_sp._emulated: the device sources and
their launchers compiled for the host, docs/emulation.md), against mhc_sp.reference and the golden
data at the contract's tolerances, at shapes that take every code path of the launch plans: the
decode plan (T <= 16: projection and finish in one launch), the prefill plan (a second kernel for
the finish), token counts that are not a multiple of the 64-token tile, hidden sizes that are not
a multiple of 8 (the scalar path), every hc_mult 1 to 8, and split-K over several blocks. Then,
bitwise within the emulation: batch invariance (a token's outputs do not depend on the other
tokens, the grid or the order of threads), and mhc_post_pre = mhc_post then mhc_pre."""

import pytest

from mhc_sp.testing import (
    EMULATED_MODULE_MISSING,
    OPS,
    assert_bitwise,
    check_outputs,
    load_emulated_module,
    random_inputs,
)

E = load_emulated_module()
pytestmark = pytest.mark.skipif(E is None, reason=EMULATED_MODULE_MISSING)

MODES = {
    "mhc_pre": "pre",
    "mhc_post_pre": "post_pre",
    "mhc_pre_broadcast": "broadcast",
    "hc_head": "head",
}


@pytest.fixture(autouse=True)
def device():
    """A small emulated GPU (4 SMs, 2 resident blocks each): the plans split H over several blocks
    at these hidden sizes."""
    E.configure(sms=4, blocks_per_sm=2, seed=1)
    yield
    E.configure()


def run(info, sample):
    out = getattr(E, info.name)(*info.schema_args(sample))
    return out if isinstance(out, tuple) else (out,)


# (T, n, H, what it takes): every plan and path of the launchers.
SHAPES = [
    (1, 4, 256, "decode, one token, 8 splits"),
    (16, 4, 200, "decode at its limit, a ragged last chunk"),
    (17, 4, 96, "prefill plan (two kernels), one tile"),
    (130, 4, 64, "three tiles, the last one of 2 tokens"),
    (65, 2, 77, "scalar path (H % 8 != 0), two tiles"),
    (5, 1, 40, "hc_mult 1"),
    (9, 3, 1000, "hc_mult 3, split-K over many chunks"),
    (20, 8, 64, "hc_mult 8 (wide leaves, local-memory tree levels)"),
    (3, 5, 136, "hc_mult 5, decode"),
    (18, 6, 48, "hc_mult 6, prefill plan"),
    (7, 7, 40, "hc_mult 7, scalar path"),
]


@pytest.mark.parametrize("T,n,H,why", SHAPES, ids=[s[3] for s in SHAPES])
@pytest.mark.parametrize("name", list(OPS))
def test_matches_reference(name, T, n, H, why):
    info = OPS[name]
    sample = info.sample(random_inputs(T, n, H, seed=T * 31 + n * 7 + H), norm=T % 2 == 1)
    check_outputs(info, sample, run(info, sample), info.call_reference(sample))


def test_shapes_take_every_plan():
    plans = {(T, n, H): E.plan_pre(n, "post_pre", T, H) for T, n, H, _ in SHAPES}
    assert any(p["fused"] for p in plans.values()) and any(not p["fused"] for p in plans.values())
    assert any(p["splits"] > 2 for p in plans.values()), plans
    assert any(p["tiles"] > 2 for p in plans.values()), plans
    assert any(p["per_split"] > 1 for p in plans.values()), plans


def test_decode_and_prefill_launch_what_their_plans_say():
    info = OPS["mhc_pre"]
    for T in (5, 40):
        plan = E.plan_pre(4, "pre", T, 256)
        E.reset_launches()
        run(info, info.sample(random_inputs(T, 4, 256, seed=T)))
        grids = [g for g, _, _, _ in E.launches()]
        assert grids[0] == plan["items"], (grids, plan)
        assert len(grids) == (1 if plan["fused"] else 2), (T, grids)


@pytest.mark.parametrize("name", list(OPS))
def test_matches_golden(golden, name):
    """The golden cases small enough for the emulation (the V4 hidden sizes at one or two tokens
    take seconds here; the others all run)."""
    info = OPS[name]
    ran = 0
    for case in golden["cases"]:
        if case["T"] * case["n"] * case["H"] > 4 * 4096 or case["T"] == 0:
            continue
        for norm in (True, False) if info.takes_norm else (True,):
            expected = case["expected" if norm else "expected_no_norm"][name]
            sample = info.sample(case["inputs"], norm)
            check_outputs(info, sample, run(info, sample), [expected[o] for o in info.outputs])
        ran += 1
    assert ran >= 8


@pytest.mark.parametrize("name", list(OPS))
def test_token_rows_do_not_depend_on_the_batch_or_the_grid(name):
    """Batch invariance (docs/design.md §3b): a prefix of the tokens, a whole prefill batch and
    another emulated GPU (SM count: other splits; seed: another order of threads) give every
    token bitwise the same outputs."""
    info = OPS[name]
    T, n, H = 70, 4, 136
    full = random_inputs(T, n, H, seed=5)
    whole = run(info, info.sample(full))
    for k in (1, 16, 17):
        part = {key: (v[:k] if v.dim() > 0 and v.shape[0] == T else v) for key, v in full.items()}
        for name_, got, want in zip(info.outputs, run(info, info.sample(part)), whole):
            assert_bitwise(f"{name}.{name_} of the first {k} tokens", got, want[:k])
    mode = MODES.get(name, "pre")
    splits = {E.plan_pre(n, mode, T, H)["splits"]} if name != "mhc_post" else set()
    for sms, seed in ((1, 7), (13, 3)):
        E.configure(sms=sms, blocks_per_sm=2, seed=seed)
        if name != "mhc_post":
            splits.add(E.plan_pre(n, mode, T, H)["splits"])
        for name_, got, want in zip(info.outputs, run(info, info.sample(full)), whole):
            assert_bitwise(f"{name}.{name_} on {sms} SMs", got, want)
    assert name == "mhc_post" or len(splits) >= 2, splits  # other split-K plans ran too


@pytest.mark.parametrize("name", ["mhc_pre", "mhc_post_pre", "hc_head"])
def test_a_decode_over_many_splits_adds_them_in_order(name):
    """The fused decode's last block loads the blocks' partials in batches of 16 and a rest before
    adding them: 18 splits (a 16-SM GPU) give bitwise what 2 splits (one SM) give, and match the
    reference."""
    info = OPS[name]
    T, n, H = 1, 4, 1100
    mode = MODES.get(name, "pre")
    sample = info.sample(random_inputs(T, n, H, seed=41))
    E.configure(sms=16, blocks_per_sm=2, seed=2)
    assert E.plan_pre(n, mode, T, H)["splits"] == 18
    many = run(info, sample)
    check_outputs(info, sample, many, info.call_reference(sample))
    E.configure(sms=1, blocks_per_sm=2, seed=2)
    assert E.plan_pre(n, mode, T, H)["splits"] < 16
    for out, got, want in zip(info.outputs, run(info, sample), many):
        assert_bitwise(f"{name}.{out}, 2 splits against 18", got, want)


@pytest.mark.parametrize("T,H", [(3, 96), (40, 77)])
def test_post_pre_equals_post_then_pre(T, H):
    s = random_inputs(T, 4, H, seed=T + H)
    post_pre = run(OPS["mhc_post_pre"], OPS["mhc_post_pre"].sample(s))
    (stream,) = run(OPS["mhc_post"], OPS["mhc_post"].sample(s))
    assert_bitwise("residual_out", post_pre[0], stream)
    pre = run(OPS["mhc_pre"], OPS["mhc_pre"].sample({**s, "residual": stream}))
    for name, got, want in zip(("post", "comb", "layer_input"), post_pre[1:], pre):
        assert_bitwise(name, got, want)


def test_bad_input_is_refused_by_the_entry():
    s = random_inputs(2, 4, 64, seed=1)
    info = OPS["mhc_pre"]
    args = list(info.schema_args(info.sample(s)))
    args[1] = args[1][:, :-1]
    with pytest.raises(ValueError, match="^fn: "):
        E.mhc_pre(*args)
