# SPDX-License-Identifier: Apache-2.0
"""The GPU harness's own kernels (csrc/testing/symm_sim.cu) on the emulated device: the thin
multi-rank wrappers that run the production kernel bodies for simulated rank blockIdx.y in one
cooperative launch, which bench/gpu_check.sh's symm_sim step runs on a GPU
(tests/cuda/test_cuda_symm.py). Here they run on an emulated device with the hostile schedule
(independent warps, poisoned shared memory, the racecheck), through the same SymmSimGroup class
(csrc/testing/symm_sim.cpp, symm_sim_bindings.cpp: one source for both). Every output is bitwise
what the emulated mhc_post_pre gives for the fp32 rank-order sum of the partials, as the World's
ranks' outputs are (test_emulated_symm.py); a rank that never arrives makes the others time out
naming it, and the next call on the broken workspace is refused on every rank."""

import subprocess
import sys

import pytest
import torch

from mhc_sp.testing import EMULATED_MODULE_MISSING, assert_bitwise
from tests.emulated.symm_world import Boundary, C, E, H, all_nan, emulated_device, no_errors
from tests.helpers.boundaries import (
    check_absent_rank_named,
    check_refused_after_absent,
    symm_collective_cases,
)

pytestmark = pytest.mark.skipif(E is None, reason=EMULATED_MODULE_MISSING)

# 4 SMs of 2 blocks: a cooperative launch of tp ranks gets 8 // tp blocks per rank, so tp 8
# runs one block per rank and tp 3 two (the harness divides the device between its ranks).
device = emulated_device(sms=4, blocks_per_sm=2, seed=11)


def harness(tp, timeout=10.0):
    return E.SymmSimGroup(tp, 0, C["default_mailbox_slot_bytes"], 1 << 20, timeout)


@pytest.mark.parametrize(
    "tp", [1, 2, 3, *(pytest.param(t, marks=pytest.mark.slow) for t in (4, 8))]
)
def test_fused_layer(tp):
    """Replicated calls (the Lamport boundary: 1, tp + 1 and 16 tokens) and sharded ones (1,
    tp - 1, tp + 1 and 37 tokens) in a row on one group, so the mailboxes and halves rotate."""
    sim = harness(tp)
    calls = [(T, False) for T in (1, tp + 1, 16)] + [(T, True) for T in (1, max(1, tp - 1), 37)]
    calls.append((tp + 1, True))
    for k, (T, sharded) in enumerate(calls):
        b = Boundary(tp, T, sharded, seed=100 * tp + k, zeros=k % 2 == 1)
        b.check_layer(b.run_harness(sim), reference=T == 1)
    no_errors(sim)


@pytest.mark.parametrize("T,sharded", [(1, False), (9, False), (1, True), (20, True)])
def test_production_launch(T, sharded):
    """A world of one through the production launch (the sharded finish a programmatic
    dependent launch, as on a GPU), on the harness's group."""
    b = Boundary(1, T, sharded, seed=40 + T)
    sim = harness(1)
    b.check_layer(b.run_harness(sim, production=True))
    no_errors(sim)


def test_production_launch_refuses_simulated_worlds():
    with pytest.raises(ValueError, match="^production: "):
        Boundary(2, 1, False, seed=1).run_harness(harness(2), production=True)


@pytest.mark.parametrize("tp", [2, 3])
def test_collectives(tp):
    sim = harness(tp)
    exchange_rows = 2 * C["default_mailbox_slot_bytes"] // (2 * H) + 3
    g = torch.Generator().manual_seed(tp)
    for op, xs, keep, want in symm_collective_cases(tp, H, exchange_rows, g):
        for r, out in enumerate(sim.collective(op, xs, keep)):
            assert_bitwise(f"{op} rows {xs[0].shape[0]} keep {keep} rank {r}", out, want(r))
    no_errors(sim)


@pytest.mark.parametrize("sharded", [False, True])
def test_absent_rank_times_out_then_every_call_is_refused(sharded):
    tp, absent = 3, 2
    sim = harness(tp, timeout=0.05)
    b = Boundary(tp, 4 * tp + 1 if sharded else 16, sharded, seed=60)
    check_absent_rank_named(sim, tp, absent, b.run_harness(sim, absent=absent))
    check_refused_after_absent(sim, absent, b.run_harness(sim))  # the absent rank arrives now
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        xs = [torch.ones(40, H, dtype=torch.bfloat16) for _ in range(tp)]
        assert all(all_nan(out) for out in sim.collective(op, xs)), op


def test_bad_calls_name_the_argument():
    sim = harness(2)
    b = Boundary(2, 3, False, seed=1)
    residuals, posts, combs = b.rank_streams()
    with pytest.raises(
        ValueError, match=r"^partials: expected one tensor per simulated rank \(2\)"
    ):
        sim.fused_layer(b.partials[:1], residuals, posts, combs, *b.harness_rest())
    meta = [torch.empty(3, 4, H, dtype=torch.bfloat16, device="meta")] * 2
    with pytest.raises(ValueError, match=r"^residuals: expected tensors on the group's device"):
        sim.fused_layer(b.partials, meta, posts, combs, *b.harness_rest())
    with pytest.raises(ValueError, match="^world: the harness simulates 1 to 8 ranks, got 9"):
        E.SymmSimGroup(9, 0, C["default_mailbox_slot_bytes"], 1 << 20, 1.0)
    with pytest.raises(ValueError, match=r"^device: expected a device index in \[0, "):
        E.SymmSimGroup(2, 1 << 10, C["default_mailbox_slot_bytes"], 1 << 20, 1.0)


def test_both_modules_bind_the_harness_in_one_process():
    """The testing module (a CUDA build) and the emulated device's module each bind their own
    SymmSimGroup (module-local types): loading one never makes the other fail to import, and the
    GPU-against-emulation comparison (tests/cuda/test_cuda_vs_emulation.py) needs both."""
    code = (
        "from mhc_sp.testing import load_emulated_module\n"
        "E = load_emulated_module()\n"
        "import mhc_sp._testing as t\n"
        "print(E.SymmSimGroup.__module__, getattr(t, 'SymmSimGroup', None) is not E.SymmSimGroup)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["mhc_sp._emulated", "True"]
