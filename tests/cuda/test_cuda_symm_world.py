# SPDX-License-Identifier: Apache-2.0
"""The symm transport as a multi-GPU user runs it, on the one GPU a check machine has: a world of
two spawned processes (gloo process group, torch symmetric memory, mhc_sp.distributed.init(
device="cuda", transport="symm")), both ranks on GPU 0, which torch allows with
TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1. This runs what the single-process checks cannot: the
pointer table built from torch's rendezvous (init, release, init again after another symmetric
tensor), the communicator's kernels_take and error checks, fused_entry and fused_head composed
over symm's collectives, system-scope atomics on another process's buffer, a killed rank, a rank
that arrives late, and ranks that disagree on num_tokens. The two processes' kernels are
time-sliced, not concurrent: correctness only, with generous timeouts. Skipped without a GPU."""

import os
import time
import traceback

import pytest
import torch

from mhc_sp import _C, ops
from mhc_sp import reference as R
from mhc_sp.config import MhcConfig
from mhc_sp.local_world import run_world
from mhc_sp.testing import pre_weights, random_inputs
from tests.helpers.boundaries import (
    boundary_cases,
    check_rank_order_bitwise,
    check_wide_range_sums,
    run_case,
    same_bits,
)

pytestmark = [
    pytest.mark.skipif(
        not torch.cuda.is_available() or not hasattr(_C, "init_symm_transport"),
        reason="needs a GPU and a CUDA build of mhc_sp",
    ),
    pytest.mark.distributed,
]

WORLD = 2
CFG = MhcConfig()
SHARED_GPU = {"TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES": "1"}


def setup(timeout):
    import mhc_sp.distributed as msd

    os.environ.update(SHARED_GPU)
    group = msd.init(device="cuda", transport="symm", timeout=timeout)
    chosen = msd.transport(group, "cuda")
    assert chosen == "symm" and chosen.reason, (chosen, getattr(chosen, "reason", None))
    return group, torch.device("cuda", torch.cuda.current_device())


def layer_call(rank, group, dev, T, sharded, seed, H=7168):
    """Rank's fused_layer of a V4-shaped boundary, and what it must return: bitwise the CUDA
    mhc_post_pre of the rank-order sum of every rank's partial (each rank draws all of them)."""
    i = random_inputs(T, 4, H, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    partials = [torch.randn(T, H, generator=g).to(torch.bfloat16) for _ in range(WORLD)]
    own = (lambda t: R.shard_tokens(t, rank, WORLD)) if sharded else (lambda t: t)  # noqa: E731
    mine = [partials[rank], own(i["residual"]), own(i["post"]), own(i["comb"])]
    mine = [t.to(dev).contiguous() for t in mine]
    proj = [t.to(dev) for t in pre_weights(i)]
    got = ops.fused_layer(*mine, *proj, group, sharded, T)
    x = R.sum_partials(partials).to(dev)
    alone = ops.mhc_post_pre(x, *[t.to(dev) for t in (i["residual"], i["post"], i["comb"])], *proj)
    return got, alone


def check_layer(rank, T, sharded, got, alone):
    shard = -(-T // WORLD) if sharded else T
    lo = rank * shard if sharded else 0
    hi = min(T, lo + shard)
    for name, a, b in zip(("residual_out", "post", "comb"), got[:3], alone[:3]):
        assert same_bits(a[: hi - lo], b[lo:hi]), f"T={T} sharded={sharded} {name}"
    assert same_bits(got[3], alone[3]), f"T={T} sharded={sharded} layer_input"


def worker_correctness(rank, world):
    """Every check runs; returns {check: "ok" or the traceback}."""
    results = {}

    def check(name, fn):
        try:
            fn()
            torch.cuda.synchronize()
            results[name] = "ok"
        except Exception:  # noqa: BLE001  (reported per check)
            results[name] = traceback.format_exc(limit=6)

    group, dev = setup(timeout=120.0)

    def boundary_ops():
        # fused_entry, fused_layer, fused_head and the collectives, every case of boundary_cases
        # (decode and sharded, token counts below, at and past the world, zero tokens), the sums
        # bit for bit reference.sum_partials.
        for case_id, case in enumerate(boundary_cases(world)):
            out = run_case(rank, world, group, dev, case_id, case)
            check_rank_order_bitwise(rank, world, case, out, dev)
        check_wide_range_sums(rank, world, group, dev)

    def v4_layers():
        for T, sharded in ((1, False), (4, False), (16, False), (9, True), (1000, True)):
            check_layer(rank, T, sharded, *layer_call(rank, group, dev, T, sharded, seed=T))

    def no_nccl_fallback():
        # Ranks on one GPU keep no NCCL communicator: what symm does not reduce raises clearly.
        x = torch.ones(4, 8, device=dev)
        with pytest.raises(ValueError, match="^x: .* no NCCL communicator"):
            ops.all_reduce(x, group)

    def two_streams():
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
        calls = []
        for k, (T, sharded) in enumerate(((3, False), (9, True), (5, False), (4, True))):
            with torch.cuda.stream(streams[k % 2]):
                calls.append((T, sharded, *layer_call(rank, group, dev, T, sharded, 70 + k, 1024)))
        torch.cuda.synchronize()
        for T, sharded, got, alone in calls:
            check_layer(rank, T, sharded, got, alone)

    def graph_replay():
        T, H = 4, 7168
        i = random_inputs(T, 4, H, seed=3, device=dev)
        partial = torch.zeros(T, H, device=dev, dtype=torch.bfloat16)
        args = (i["residual"], i["post"], i["comb"], *pre_weights(i))
        ops.fused_layer(partial, *args, group, False, T)  # warm-up
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = ops.fused_layer(partial, *args, group, False, T)
        for k in range(5):
            g = torch.Generator().manual_seed(100 + k)
            parts = [torch.randn(T, H, generator=g).to(torch.bfloat16) for _ in range(world)]
            partial.copy_(parts[rank])
            graph.replay()
            want = ops.mhc_post_pre(R.sum_partials(parts).to(dev), *args)
            for a, b in zip(captured, want):
                assert torch.equal(a, b), f"replay {k}"

    def init_again():
        # A new symmetric tensor shifts where the next buffer sits in torch's pool: init builds
        # the table from each rank's own offset, so the kernels still find every peer's buffer.
        from torch.distributed import _symmetric_memory as symm_mem

        import mhc_sp.distributed as msd

        spare = symm_mem.empty(3 << 20, dtype=torch.uint8, device=dev)
        msd.init(device="cuda", transport="symm", timeout=120.0)
        for T, sharded in ((2, False), (7, True)):
            check_layer(rank, T, sharded, *layer_call(rank, group, dev, T, sharded, 80 + T))
        del spare

    for name, fn in (
        ("boundary_ops", boundary_ops),
        ("v4_layers", v4_layers),
        ("no_nccl_fallback", no_nccl_fallback),
        ("two_streams", two_streams),
        ("graph_replay", graph_replay),
        ("init_again", init_again),
    ):
        check(name, fn)
    return results


def run(fn, *args, timeout=45, expect_exit=frozenset()):
    # Each rank sets SHARED_GPU itself (setup), before torch's rendezvous reads it.
    return run_world(
        WORLD, fn, *args, timeout=timeout, expect_exit=expect_exit, collective_timeout=60
    )


def test_two_processes_on_one_gpu_match_the_reference():
    results = run(worker_correctness, timeout=90)
    failed = {
        f"rank {r} {k}": v for r, res in enumerate(results) for k, v in res.items() if v != "ok"
    }
    assert not failed, "\n".join(f"--- {k} ---\n{v}" for k, v in failed.items())
    assert all(set(res) == set(results[0]) for res in results)


def expect_raises_naming(fn, peer, what):
    with pytest.raises(RuntimeError, match=f"rank {peer}") as info:
        fn()
    assert what in str(info.value), str(info.value)


def worker_mismatch(rank, world):
    """Ranks disagree on num_tokens, in a replicated call (the Lamport tags differ) and, after
    init again, in a sharded one (the exchange's headers differ): every rank's outputs are NaN
    and its next op raises, naming the other rank."""
    import mhc_sp.distributed as msd

    nan = []
    for sharded in (False, True):
        group, dev = setup(timeout=60.0)
        T = (9 if sharded else 4) + rank
        got, _ = layer_call(rank, group, dev, T, sharded, seed=11)
        torch.cuda.synchronize()
        nan.append(all(bool(torch.isnan(t.float()).all()) for t in got))
        expect_raises_naming(
            lambda: layer_call(rank, group, dev, T, sharded, seed=12),  # noqa: B023
            1 - rank,
            "made a different call",
        )
        msd.destroy()
    return nan


def test_ranks_that_disagree_on_num_tokens_fail_together():
    assert run(worker_mismatch, timeout=60) == [[True, True], [True, True]]


def worker_late_rank(rank, world):
    """Rank 1 calls only after rank 0 has timed out: rank 0 records the timeout naming rank 1;
    rank 1's call is refused (NaN outputs, kPeerBroken naming rank 0); both then raise."""
    import torch.distributed as dist

    timeout = 3.0
    group, dev = setup(timeout=timeout)
    if rank == 1:
        time.sleep(timeout + 4.0)
    t = time.monotonic()
    got, _ = layer_call(rank, group, dev, 16, False, seed=13)
    torch.cuda.synchronize()
    waited = time.monotonic() - t
    nan = all(bool(torch.isnan(t_.float()).all()) for t_ in got)
    dist.barrier()
    if rank == 0:
        expect_raises_naming(lambda: layer_call(0, group, dev, 16, False, 14), 1, "timed out")
    else:
        expect_raises_naming(lambda: layer_call(1, group, dev, 16, False, 14), 0, "refused")
    return nan, waited


def test_late_rank_is_refused_and_both_raise():
    (nan0, waited0), (nan1, waited1) = run(worker_late_rank)
    assert nan0 and nan1
    assert waited0 < 3.0 + 30, waited0  # the timeout, plus time slices of the shared GPU
    assert waited1 < 30, waited1


def worker_killed_rank(rank, world):
    """Rank 1 dies after init; rank 0's boundary gives up after the timeout and its next op
    raises, naming rank 1."""
    timeout = 3.0
    group, dev = setup(timeout=timeout)
    if rank == 1:
        os._exit(0)
    time.sleep(1.0)
    t = time.monotonic()
    got, _ = layer_call(rank, group, dev, 9, True, seed=15)
    torch.cuda.synchronize()
    waited = time.monotonic() - t
    expect_raises_naming(lambda: layer_call(0, group, dev, 9, True, 16), 1, "timed out")
    return all(bool(torch.isnan(t_.float()).all()) for t_ in got), waited


def test_killed_rank_makes_the_peer_raise_naming_it():
    results = run(worker_killed_rank, expect_exit={1})
    nan, waited = results[0]
    assert nan and waited < 3.0 + 10, waited
