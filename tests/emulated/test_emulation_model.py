# SPDX-License-Identifier: Apache-2.0
"""The emulated device itself (csrc/emulation/, docs/emulation.md): the execution model must be
faithful enough that a missing barrier, a wrong lane layout or a wait that cannot end fails a
test instead of passing by luck or hanging. Small kernels of the emulation module's own
(csrc/emulation/selftest.cpp), launched through the production launch path."""

import pytest
import torch

from mhc_sp.testing import EMULATED_MODULE_MISSING, load_emulated_module

E = load_emulated_module()
pytestmark = pytest.mark.skipif(E is None, reason=EMULATED_MODULE_MISSING)


@pytest.fixture(autouse=True)
def device():
    E.configure(sms=2, blocks_per_sm=2, seed=3)
    yield
    E.configure()


@pytest.mark.parametrize("lane_mask", [1, 2, 16, 31])
def test_shuffle_reads_the_partner_lane(lane_mask):
    got = E.selftest_shfl(lane_mask)
    assert got.tolist() == [float(lane ^ lane_mask) for lane in range(32)]


def test_a_missing_barrier_shows():
    threads = 128
    want = [(t + 1) % threads + 1 for t in range(threads)]
    assert E.selftest_neighbours(threads, True).tolist() == want
    # Without the barrier a thread runs on before its neighbour wrote: some read stale values.
    wrong = sum(a != b for a, b in zip(E.selftest_neighbours(threads, False).tolist(), want))
    assert wrong > 0


def test_divergent_barriers_are_reported():
    with pytest.raises(RuntimeError, match="different barriers.*selftest.cpp"):
        E.selftest_divergent_barrier()


def test_a_warp_collective_without_every_lane_is_a_deadlock_not_a_hang():
    with pytest.raises(RuntimeError, match="deadlock.*warp collective at selftest.cpp"):
        E.selftest_partial_warp()


def test_mma_follows_the_isa_fragment_layout():
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-8, 9, (16, 16), generator=g).to(torch.bfloat16)
    b = torch.randint(-8, 9, (16, 8), generator=g).to(torch.bfloat16)
    assert torch.equal(E.selftest_mma(a, b), a.float() @ b.float())  # small integers: exact
    # A row or column moved by one is a different product: the layout, not just the values, counts.
    perm = torch.arange(16).roll(1)
    assert not torch.equal(E.selftest_mma(a[perm], b), a.float() @ b.float())


def test_blocks_that_wait_for_each_other_progress():
    E.selftest_chain(4, wait_for_later=True)  # 4 blocks: all resident (2 SMs x 2)
    E.selftest_chain(9, wait_for_later=False)  # more than resident, but each waits for an earlier


def test_a_grid_that_waits_for_blocks_that_cannot_be_resident_is_stopped():
    E.configure(sms=2, blocks_per_sm=2, seed=3, launch_timeout_s=1.0)
    with pytest.raises(RuntimeError, match="launch timeout"):
        E.selftest_chain(5, wait_for_later=True)  # block 3 waits for block 4, which never starts


def test_a_cooperative_grid_beyond_the_resident_blocks_is_refused():
    E.selftest_chain(4, wait_for_later=True, cooperative=True)
    with pytest.raises(RuntimeError, match="cooperative launch of 5 blocks does not fit"):
        E.selftest_chain(5, wait_for_later=True, cooperative=True)
