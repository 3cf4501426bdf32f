# SPDX-License-Identifier: Apache-2.0
"""The CUDA projection's summation order, on the host: mhc_sp._testing.leaf_tree_sum runs the
kernels' own LeafTree (csrc/cuda/device/leaf_tree.h, registers and shared-memory levels)
with a block's leaves pushed per_block at a time and the blocks' totals added by the finish's
tree. It must give bitwise the pairwise tree of a stack model written here (each push merges the
two top nodes once per trailing zero bit of the count; the total adds the rest from the top down),
for any leaf count and any split: that is what makes the CUDA pre family batch invariant."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mhc_sp.testing import TESTING_MODULE_MISSING

_testing = pytest.importorskip("mhc_sp._testing", reason=TESTING_MODULE_MISSING)


def stack_model_sum(leaves: np.ndarray) -> np.float32:
    nodes: list[np.float32] = []
    for k, leaf in enumerate(leaves, start=1):
        nodes.append(np.float32(leaf))
        while k % 2 == 0:
            right = nodes.pop()
            nodes[-1] = np.float32(nodes[-1] + right)
            k //= 2
    total = nodes[-1]
    for node in reversed(nodes[:-1]):
        total = np.float32(node + total)
    return total


def leaves_of(count: int, seed: int) -> np.ndarray:
    # Magnitudes spread over many binades, so that every change of order changes bits.
    g = np.random.default_rng(seed)
    return (g.standard_normal(count) * 2.0 ** g.integers(-20, 20, count)).astype(np.float32)


def bits(x) -> int:
    return int(np.float32(x).view(np.uint32))


@given(
    count=st.integers(1, 300),
    per_block=st.sampled_from([1, 2, 4, 8, 16, 32]),
    seed=st.integers(0, 99),
)
def test_every_split_adds_in_the_one_tree(count, per_block, seed):
    leaves = leaves_of(count, seed)
    want = stack_model_sum(leaves)
    got = _testing.leaf_tree_sum([float(v) for v in leaves], per_block)
    assert bits(got) == bits(want), (count, per_block)


def test_order_matters_for_these_leaves():
    # The check above can fail: a sequential sum of the same leaves differs.
    leaves = leaves_of(224, 3)  # H = 7168 at n = 4: 224 chunks of 32 positions
    sequential = np.float32(0)
    for v in leaves:
        sequential = np.float32(sequential + v)
    assert bits(sequential) != bits(stack_model_sum(leaves))
    assert bits(_testing.leaf_tree_sum([float(v) for v in leaves], 32)) == bits(
        stack_model_sum(leaves)
    )


def test_signed_zero_of_a_single_leaf_survives():
    # total() copies the first node instead of adding it to +0, which would turn -0 into +0.
    assert bits(_testing.leaf_tree_sum([-0.0], 1)) == bits(np.float32(-0.0))


def test_bad_arguments():
    with pytest.raises(ValueError, match="^per_block: "):
        _testing.leaf_tree_sum([1.0], 3)
    with pytest.raises(ValueError, match="^per_block: "):
        _testing.leaf_tree_sum([1.0], 64)
    with pytest.raises(ValueError, match="^leaves: "):
        _testing.leaf_tree_sum([], 1)
