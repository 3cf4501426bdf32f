# SPDX-License-Identifier: Apache-2.0
"""Batch invariance of the CPU math ops (docs/design.md §3b): a token's outputs are bitwise the
same whatever else shares its call and however many threads run it. The kernels fix one summation
order by the hidden size alone; these tests hold every path to it (decode-size calls that split
the hidden dimension, token blocks of every size, 1 and 2 threads)."""

import pytest
import torch

from mhc_sp import ops
from mhc_sp.testing import OPS, pre_weights, random_inputs

TOKENS = [*range(1, 41), 255, 256, 257]
PER_TOKEN = ("residual", "x", "post", "comb")  # the inputs with a row per token


def first_rows(inputs: dict, T: int) -> dict:
    return {k: (v[:T] if k in PER_TOKEN else v) for k, v in inputs.items()}


def with_threads(n: int, fn):
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(saved)


# H = 1040: eight full 128-wide leaves and a 16-wide one; H = 100: a last leaf that is no multiple
# of the 8- and 16-wide vector steps. n = 2 and 4 (mhc_pre_broadcast projects one stream).
@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("n,H", [(4, 1040), (2, 100)])
def test_rows_do_not_depend_on_the_call(name, n, H):
    info = OPS[name]
    inputs = random_inputs(max(TOKENS), n, H, seed=n * 1000 + H)
    # The reference rows: every token in one call on one thread.
    full = with_threads(1, lambda: info.call(info.sample(inputs)))
    threads = max(2, torch.get_num_threads())
    for T in TOKENS:
        got = with_threads(threads, lambda: info.call(info.sample(first_rows(inputs, T))))
        for out_name, a, b in zip(info.outputs, got, full):
            assert torch.equal(a, b[:T]), f"{name}.{out_name}: T={T} rows differ from the full call"
    one = with_threads(1, lambda: info.call(info.sample(first_rows(inputs, 1))))
    for out_name, a, b in zip(info.outputs, one, full):
        assert torch.equal(a, b[:1]), f"{name}.{out_name}: T=1 on one thread"


@pytest.mark.parametrize("T", [1, 3, 7, 40])
def test_post_pre_is_post_then_pre_bitwise(T):
    """One order for the projection and the squares, whether the rows come from memory or from
    the post just computed."""
    i = random_inputs(T, 4, 1040, seed=T)
    fused = ops.mhc_post_pre(
        i["x"],
        i["residual"],
        i["post"],
        i["comb"],
        *pre_weights(i),
    )
    residual = ops.mhc_post(i["x"], i["residual"], i["post"], i["comb"])
    separate = (residual, *ops.mhc_pre(residual, *pre_weights(i)))
    for a, b in zip(fused, separate):
        assert torch.equal(a, b)
