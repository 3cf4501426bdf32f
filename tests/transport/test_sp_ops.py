# SPDX-License-Identifier: Apache-2.0
"""Collectives and fused boundary ops on real worlds of 2, 3 and 4 spawned ranks (4 ranks share
the 2 cores of CI), every rank's outputs against mhc_sp.reference computed on the full tensors in
one process. On CPU every case runs on both transports in the same world: shm (the group's
default, one pass over shared memory) and gloo (a second group over the same ranks). Both sum
partials exactly as reference.sum_partials does (rank order, from +0), so they agree bit for bit
with it and with each other for every world size.

The checks and the world worker are tests/helpers/boundaries.py (worlds of 8, symm, NCCL and
separate hosts run them too); here the worlds of 2, 3 and 4, a boundary large enough for the
streaming stores, torch.compile, and the failures: a wrong shape on one rank, a rank that exits
early, unknown groups, and a world of one."""

import time

import pytest
import torch

from mhc_sp import ops
from mhc_sp import reference as R
from mhc_sp.config import MhcConfig
from mhc_sp.local_world import COLLECTIVE_TIMEOUT_S, run_world
from mhc_sp.testing import head_weights, pre_weights, random_inputs, stream_inputs
from tests.helpers.boundaries import (
    boundary_cases,
    check_layer_outputs,
    partials_for,
    same_bits,
    worker_fused_ops,
)

CFG = MhcConfig()


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3, 4])
def test_fused_ops_match_reference(world):
    results = run_world(world, worker_fused_ops, start="forkserver")
    assert [checked for checked, _ in results] == [len(boundary_cases(world))] * world
    # Replicated boundaries give every rank bitwise the same outputs.
    digests = [d for _, d in results]
    assert len(digests[0]) == sum(not c[4] for c in boundary_cases(world))
    assert digests == [digests[0]] * world


def worker_large_boundary(rank, world):
    """A boundary whose published rows exceed the size from which shm streams them past the
    caches (1 MiB): sharded fused_layer and fused_head bitwise those of the single-device ops on
    the rank-order sum."""
    import mhc_sp.distributed as msd

    group = msd.init(device="cpu", transport="shm")
    T, n, H = 1100, 4, 1024  # 550 rows of 2 KiB published per rank and copy
    i = random_inputs(T, n, H, seed=11)
    partials = partials_for(world, T, H, seed=12)
    total = R.sum_partials(partials)
    mine = [R.shard_tokens(t, rank, world) for t in stream_inputs(i)]
    rows = mine[0].shape[0]
    lo, hi = rank * rows, min(T, (rank + 1) * rows)
    got = ops.fused_layer(partials[rank], *mine, *pre_weights(i), group, True, T)
    alone = ops.mhc_post_pre(total, i["residual"], i["post"], i["comb"], *pre_weights(i))
    for a, b in zip(got[:3], alone[:3]):
        assert same_bits(a[: hi - lo], b[lo:hi])
    assert same_bits(got[3], alone[3])
    head = ops.fused_head(partials[rank], *mine, *head_weights(i), group, True, T)
    stream = ops.mhc_post(total, i["residual"], i["post"], i["comb"])
    assert same_bits(head[1][: hi - lo], stream[lo:hi])
    assert same_bits(head[0], ops.hc_head(stream, *head_weights(i)))
    return True


@pytest.mark.distributed
def test_large_boundary_on_shm():
    assert run_world(2, worker_large_boundary, start="forkserver") == [True, True]


def sharded_case(rank: int, world: int, T: int, seed: int) -> tuple:
    """A boundary of T tokens (hc_mult 4, H = 64): the inputs, this rank's partial (seed + 1) and
    this rank's shard of the stream (residual, post, comb)."""
    i = random_inputs(T, 4, 64, seed=seed)
    partial = partials_for(world, T, 64, seed=seed + 1)[rank]
    return i, partial, tuple(R.shard_tokens(t, rank, world) for t in stream_inputs(i))


def worker_compiled_boundary(rank, world):
    import mhc_sp.distributed as msd

    group = msd.init()
    T = 11
    i, partial, (res, post, comb) = sharded_case(rank, world, T, seed=5)

    def boundary(partial, residual, post, comb):
        out = ops.fused_layer(partial, residual, post, comb, *pre_weights(i), group, True, T)
        return out[0], out[3] * 2

    compiled = torch.compile(boundary, fullgraph=True)
    for a, b in zip(compiled(partial, res, post, comb), boundary(partial, res, post, comb)):
        assert torch.equal(a, b)
    return True


@pytest.mark.distributed
def test_compiled_boundary():
    assert run_world(2, worker_compiled_boundary, start="forkserver") == [True, True]


def worker_wrong_shape(rank, world):
    import mhc_sp.distributed as msd

    group = msd.init()
    T = 8
    i, partial, (res, post, comb) = sharded_case(rank, world, T, seed=1)
    unnormed = (i["fn"], i["scale"], i["base"], None)
    if rank == 1:
        with pytest.raises(ValueError, match="^partial: expected size 64 at dim 1"):
            ops.fused_layer(
                partial[:, :32].contiguous(), res, post, comb, *unnormed, group, True, T
            )
        with pytest.raises(ValueError, match=r"^residual: expected 2 rows"):
            ops.fused_layer(partial, i["residual"], i["post"], i["comb"], *unnormed, group, True, T)
        return "raised"
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        ops.fused_layer(partial, res, post, comb, *unnormed, group, True, T)
    return time.monotonic() - start


@pytest.mark.distributed
def test_wrong_shape_on_one_rank_raises_and_peers_fail_in_time():
    results = run_world(4, worker_wrong_shape, timeout=COLLECTIVE_TIMEOUT_S * 6, start="forkserver")
    assert results[1] == "raised"
    for r in (0, 2, 3):
        assert results[r] < COLLECTIVE_TIMEOUT_S * 3


def worker_early_exit(rank, world):
    import os

    import mhc_sp.distributed as msd

    group = msd.init()
    if rank == 1:
        os._exit(0)
    x = torch.ones(4, 8)
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        ops.all_reduce(x, group)
        ops.all_reduce(x, group)
    return time.monotonic() - start


@pytest.mark.distributed
def test_rank_exiting_early_makes_peers_fail_not_hang():
    results = run_world(
        2, worker_early_exit, timeout=COLLECTIVE_TIMEOUT_S * 6, expect_exit={1}, start="forkserver"
    )
    assert results[0] < COLLECTIVE_TIMEOUT_S * 3


def worker_group_errors(rank, world):
    import torch.distributed as dist

    import mhc_sp.distributed as msd

    x = torch.ones(4, 8)
    with pytest.raises(ValueError, match="not initialised with mhc_sp"):
        ops.all_reduce(x, "0")
    with pytest.raises(ValueError, match="unknown torch.distributed group"):
        msd.init("no-such-group")
    sub = dist.new_group([0, 1], backend="gloo")
    name = msd.init(sub)
    assert name == sub.group_name
    torch.testing.assert_close(ops.all_reduce(x, sub), x * 2)
    with pytest.raises(ValueError, match="'nope' is not initialised with mhc_sp"):
        msd.rank_and_world("nope")
    return True


@pytest.mark.distributed
def test_group_errors():
    assert run_world(2, worker_group_errors, start="forkserver") == [True, True]


def test_world_of_one_without_torch_distributed():
    import mhc_sp.distributed as msd

    group = msd.init()
    T, n, H = 5, 4, 64
    i = random_inputs(T, n, H, seed=8)
    stream = (i["x"], i["residual"], i["post"], i["comb"])  # a world of one: x is the partial
    for sharded in (True, False):
        got = ops.fused_layer(*stream, *pre_weights(i), group, sharded, T)
        exp = R.fused_layer(*([t] for t in stream), *pre_weights(i), sharded, T, CFG)[0]
        check_layer_outputs(got, exp, i, i["norm_weight"], f"world1 sharded={sharded}")
    x = torch.randn(6, 3)
    assert (
        torch.equal(ops.all_gather(x, group), x)
        and ops.all_gather(x, group).data_ptr() != x.data_ptr()
    )
    assert torch.equal(ops.reduce_scatter(x, group), x)
    assert torch.equal(ops.all_reduce(x, group), x)
    with pytest.raises(ValueError, match=r"^num_tokens: expected -1 or a value in \[0, 6\]"):
        ops.all_gather(x, group, 7)
    with pytest.raises(ValueError, match=r"^rank: expected a value in \[0, 2\)"):
        ops.shard_tokens(x, 2, 2)
    with pytest.raises(ValueError, match=r"^num_tokens: expected a value in \[0, 5\]"):
        ops.fused_layer(*stream, i["fn"], i["scale"], i["base"], None, group, True, 6)
    with pytest.raises(TypeError, match="^x: expected dtype BFloat16"):
        ops.fused_entry(i["x"].float(), i["fn"], i["scale"], i["base"], None, group, True)
    with pytest.raises(ValueError, match=r"^fn: expected size 24 at dim 0"):
        ops.fused_entry(i["x"], i["head_fn"], i["scale"], i["base"], None, group, True)
    with pytest.raises(ValueError, match=r"^head_fn: expected size 4 at dim 0"):
        ops.fused_head(*stream, i["fn"], i["head_scale"], i["head_base"], group, True, T)
    with pytest.raises(ValueError, match=r"^head_scale: expected size 1"):
        ops.fused_head(*stream, i["head_fn"], i["scale"], i["head_base"], group, True, T)
    with pytest.raises(ValueError, match=r"^residual: expected 5 rows"):
        ops.fused_head(
            i["x"],
            i["residual"][:4].contiguous(),
            i["post"][:4].contiguous(),
            i["comb"][:4].contiguous(),
            *head_weights(i),
            group,
            False,
            T,
        )
    msd.destroy()
    with pytest.raises(ValueError, match="not initialised with mhc_sp"):
        ops.all_reduce(x, group)
