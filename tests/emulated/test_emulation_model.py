# SPDX-License-Identifier: Apache-2.0
"""The emulated device itself (csrc/emulation/, docs/emulation.md): the execution model must be
faithful enough that a missing barrier, a wrong lane layout or a wait that cannot end fails a
test instead of passing by luck or hanging. Small kernels of the emulation module's own
(csrc/emulation/selftest.cpp), launched through the production launch path."""

import pytest
import torch

from mhc_sp.testing import EMULATED_MODULE_MISSING, load_emulated_module
from tests.emulated.symm_world import emulated_device

E = load_emulated_module()
pytestmark = pytest.mark.skipif(E is None, reason=EMULATED_MODULE_MISSING)


device = emulated_device(sms=2, blocks_per_sm=2, seed=3)

#: The racecheck, the poison and the weak-poll check see every access through the emulation's
#: access hooks, which the sanitizer builds (scripts/sanitize.sh) replace with their own.
needs_access_checks = pytest.mark.skipif(
    E is not None and not E.access_checks,
    reason="a sanitizer build: the device sources carry that sanitizer's instrumentation, not the "
    "emulation's access hooks (racecheck, poison, weak polls)",
)


def test_only_a_sanitizer_build_goes_without_the_access_checks():
    # The tests below skip without the access hooks: a normal build that lost them would make
    # the racecheck, poison and weak-poll tests skip silently.
    assert E.access_checks is not E.sanitized


@pytest.mark.parametrize("lane_mask", [1, 2, 16, 31])
def test_shuffle_reads_the_partner_lane(lane_mask):
    got = E.selftest_shfl(lane_mask)
    assert got.tolist() == [float(lane ^ lane_mask) for lane in range(32)]


@needs_access_checks
def test_a_missing_barrier_is_a_race_and_shows():
    threads = 128
    want = [(t + 1) % threads + 1 for t in range(threads)]
    assert E.selftest_neighbours(threads, True).tolist() == want
    # Without the barrier the racecheck names both sites: the write and the neighbour's read.
    with pytest.raises(RuntimeError, match=r"racecheck.*selftest.cpp:\d+.*selftest.cpp:\d+"):
        E.selftest_neighbours(threads, False)
    # Without the racecheck, a thread runs on before its neighbour wrote: some read the poison.
    E.configure(sms=2, blocks_per_sm=2, seed=3, racecheck=False)
    got = E.selftest_neighbours(threads, False).tolist()
    assert sum(a != b for a, b in zip(got, want)) > 0
    assert -1 in got  # __shared__ starts as all-ones bytes, not zeros


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


@needs_access_checks
def test_a_warp_collective_is_no_barrier_between_warps():
    # The shuffle orders the lanes of each warp, not warp 0's writes before warp 1's reads.
    with pytest.raises(
        RuntimeError, match=r"racecheck.*cross_warp_kernel.*warp 1|racecheck.*warp 1"
    ):
        E.selftest_cross_warp(barrier=False)
    assert E.selftest_cross_warp(barrier=True).tolist() == list(range(1, 33))


def test_lanes_of_one_warp_are_ordered_by_their_collective():
    assert E.selftest_same_warp().tolist() == [(lane ^ 1) + 1 for lane in range(32)]


@needs_access_checks
@pytest.mark.parametrize("schedule", ["random", "warp_ahead", "warp_behind", "in_order"])
def test_shared_memory_starts_poisoned_in_every_block(schedule):
    E.configure(sms=2, blocks_per_sm=2, seed=3, schedule=schedule)
    # Blocks reuse their OS thread's __shared__ copy: each starts with all-ones bytes anyway.
    assert E.selftest_fresh_flag(6).tolist() == [-1] * 6


@needs_access_checks
def test_a_poll_through_a_weak_load_is_reported():
    E.selftest_poll(weak=False)
    with pytest.raises(RuntimeError, match=r"poll through a weak.*ld.global.u32.*selftest.cpp"):
        E.selftest_poll(weak=True)


def test_a_scope_narrower_than_sys_on_host_mapped_memory_is_reported():
    E.selftest_gpu_scope_store(host_mapped=False)  # device memory: .gpu is its scope
    with pytest.raises(RuntimeError, match=r"st.relaxed.gpu.*host-mapped memory.*needs .sys"):
        E.selftest_gpu_scope_store(host_mapped=True)


def test_ptx_the_interpreter_does_not_know_is_refused():
    with pytest.raises(RuntimeError, match=r"does not run the PTX 'add.u32 .*selftest.cpp"):
        E.selftest_unknown_ptx()


def test_a_programmatic_dependent_runs_beside_its_primary():
    n = 4096
    want = list(range(1, n + 1))
    wrong_somewhere = False
    for seed in range(4):
        E.configure(sms=2, blocks_per_sm=2, seed=seed)
        E.reset_launches()
        assert E.selftest_pdl(n, wait=True).tolist() == want
        primary, dependent = E.timeline()
        assert dependent["dependent"] and not primary["dependent"]
        # The dependent started before the primary completed: real overlap, not stream order.
        assert dependent["start_ns"] < primary["end_ns"]
        # Reading before griddepcontrol.wait reads what the primary has not written yet.
        wrong_somewhere |= E.selftest_pdl(n, wait=False).tolist() != want
    assert wrong_somewhere


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"sms": 0, "blocks_per_sm": 2}, "sms"),
        ({"sms": 2, "blocks_per_sm": 33}, "blocks_per_sm"),
        ({"sms": 2, "blocks_per_sm": 2, "lag_us": -1}, "lag_us"),
        ({"sms": 2, "blocks_per_sm": 2, "lag_us": 2_000_000}, "lag_us"),
    ],
)
def test_a_bad_device_size_or_lag_is_refused_naming_it(kwargs, argument):
    with pytest.raises(ValueError, match=f"^{argument}: "):
        E.configure_device(1, **kwargs)
