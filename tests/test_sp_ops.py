"""Collectives and fused boundary ops on real gloo worlds of 2, 3 and 4 spawned ranks, every
rank's outputs against mhc_sp.reference computed on the full tensors in one process."""

import time

import pytest
import torch

from dist_harness import COLLECTIVE_TIMEOUT_S, run_world
from mhc_sp import ops
from mhc_sp import reference as R
from mhc_sp.config import MhcConfig
from mhc_sp.testing import assert_close, random_inputs

CFG = MhcConfig()


def partials_for(world, rows, H, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, H, generator=g).to(torch.bfloat16) for _ in range(world)]


def stream_for(full, rank, world, sharded):
    return R.shard_tokens(full, rank, world) if sharded else full


def check_layer_outputs(got, expected, i, norm_weight, tag):
    residual, post, comb, layer_input = got
    assert_close(residual, expected[0], f"{tag} residual_out")
    # Coefficients against the reference pre of the op's own stream (see test_mhc_ops).
    exp_post, exp_comb, _ = R.mhc_pre(residual, i["fn"], i["scale"], i["base"], norm_weight, CFG)
    assert_close(post, exp_post, f"{tag} post_out")
    assert_close(comb, exp_comb, f"{tag} comb_out")
    assert_close(layer_input, expected[3], f"{tag} layer_input")


def boundary_cases(world):
    """(num_tokens, extra partial rows, n, H, sharded, norm) covering odd counts, fewer tokens than
    ranks, one token, zero tokens, and partials padded past num_tokens."""
    cases = []
    for T in sorted({0, 1, world - 1, world + 1, 7, 33}):
        for sharded in (True, False):
            cases.append((T, 0, 4, 64, sharded, True))
    cases += [(13, 3, 4, 96, True, False), (10, (-10) % world, 2, 64, True, True),
              (10, 2, 4, 64, False, True), (5, 0, 4, 40, True, True)]
    return cases


def worker_fused_ops(rank, world, device_type="cpu"):
    """Every fused op and collective on this rank vs the reference (computed on CPU)."""
    import mhc_sp.distributed as msd

    group = msd.init(device=device_type)
    assert msd.rank_and_world(group) == (rank, world)
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    on = lambda t: t.to(device)  # noqa: E731
    cpu = lambda ts: [t.cpu() for t in ts]  # noqa: E731
    checked = 0
    for case_id, (T, extra, n, H, sharded, norm) in enumerate(boundary_cases(world)):
        tag = f"[world={world} rank={rank} T={T} extra={extra} n={n} H={H} sharded={sharded} norm={norm}]"
        i = random_inputs(T, n, H, seed=100 + case_id)
        w = i["norm_weight"] if norm else None

        # fused_entry: the embedding output x is replicated.
        exp = R.fused_entry(i["x"], i["fn"], i["scale"], i["base"], w, world, sharded, CFG)[rank]
        d = {k: on(v) for k, v in i.items()}
        dw = d["norm_weight"] if norm else None
        got = cpu(ops.fused_entry(d["x"], d["fn"], d["scale"], d["base"], dw, group, sharded))
        assert torch.equal(got[0], exp[0]), tag + " entry residual"
        for name, a, b in zip(("post", "comb", "layer_input"), got[1:], exp[1:]):
            assert_close(a, b, f"{tag} entry {name}")

        # fused_layer: every rank holds its own un-reduced partial (maybe with padding rows).
        partials = partials_for(world, T + extra, H, seed=200 + case_id)
        residuals = [stream_for(i["residual"], r, world, sharded) for r in range(world)]
        posts = [stream_for(i["post"], r, world, sharded) for r in range(world)]
        combs = [stream_for(i["comb"], r, world, sharded) for r in range(world)]
        exp = R.fused_layer(partials, residuals, posts, combs, i["fn"], i["scale"], i["base"], w,
                            sharded, T, CFG)[rank]
        got = cpu(ops.fused_layer(on(partials[rank]), on(residuals[rank]), on(posts[rank]), on(combs[rank]),
                                  d["fn"], d["scale"], d["base"], dw, group, sharded, T))
        check_layer_outputs(got, exp, i, w, tag + " layer")
        if sharded:  # padding rows of the last shard stay zero
            pad = residuals[rank].shape[0] * (rank + 1) - T
            if pad > 0:
                assert torch.count_nonzero(got[0][-pad:]) == 0, tag + " padding rows leaked"

        # fused_head
        exp = R.fused_head(partials, residuals, posts, combs, i["head_fn"], i["head_scale"],
                           i["head_base"], sharded, T, CFG.rms_eps, CFG.hc_eps)[rank]
        got = cpu(ops.fused_head(on(partials[rank]), on(residuals[rank]), on(posts[rank]), on(combs[rank]),
                                 d["head_fn"], d["head_scale"], d["head_base"], group, sharded, T))
        assert_close(got[0], exp[0], tag + " head hidden")
        assert_close(got[1], exp[1], tag + " head residual_out")

        # The plain collectives.
        assert_close(ops.reduce_scatter(on(partials[rank]), group).cpu(), R.reduce_scatter(partials)[rank], tag + " reduce_scatter")
        assert_close(ops.all_reduce(on(partials[rank]), group).cpu(), R.all_reduce(partials)[rank], tag + " all_reduce")
        shards = [R.shard_tokens(i["x"], r, world) for r in range(world)]
        assert torch.equal(ops.shard_tokens(d["x"], rank, world).cpu(), shards[rank]), tag + " shard_tokens"
        assert torch.equal(ops.all_gather(on(shards[rank]), group, T).cpu(), R.all_gather(shards, T)), tag + " all_gather"
        assert torch.equal(ops.all_gather(on(shards[rank]), group).cpu(), R.all_gather(shards)), tag + " all_gather(-1)"
        checked += 1
    fp32 = partials_for(world, 9, 8, seed=7)
    fp32 = [p.float() for p in fp32]
    torch.testing.assert_close(ops.reduce_scatter(on(fp32[rank]), group).cpu(), R.reduce_scatter(fp32)[rank])
    return checked


@pytest.mark.parametrize("world", [2, 3, 4])
def test_fused_ops_match_reference(world):
    checked = run_world(world, worker_fused_ops)
    assert checked == [len(boundary_cases(world))] * world


def worker_compiled_boundary(rank, world):
    import mhc_sp.distributed as msd

    group = msd.init()
    T, n, H = 11, 4, 64
    i = random_inputs(T, n, H, seed=5)
    partials = partials_for(world, T, H, seed=6)
    res = R.shard_tokens(i["residual"], rank, world)
    post = R.shard_tokens(i["post"], rank, world)
    comb = R.shard_tokens(i["comb"], rank, world)

    def boundary(partial, residual, post, comb):
        out = ops.fused_layer(partial, residual, post, comb, i["fn"], i["scale"], i["base"],
                              i["norm_weight"], group, True, T)
        return out[0], out[3] * 2

    compiled = torch.compile(boundary, fullgraph=True)
    for a, b in zip(compiled(partials[rank], res, post, comb), boundary(partials[rank], res, post, comb)):
        assert torch.equal(a, b)
    return True


def test_compiled_boundary_on_gloo():
    assert run_world(2, worker_compiled_boundary) == [True, True]


def worker_wrong_shape(rank, world):
    import mhc_sp.distributed as msd

    group = msd.init()
    T, n, H = 8, 4, 64
    i = random_inputs(T, n, H, seed=1)
    partial = partials_for(world, T, H, seed=2)[rank]
    res, post, comb = (R.shard_tokens(i[k], rank, world) for k in ("residual", "post", "comb"))
    if rank == 1:
        with pytest.raises(ValueError, match="^partial: expected size 64 at dim 1"):
            ops.fused_layer(partial[:, :32].contiguous(), res, post, comb, i["fn"], i["scale"],
                            i["base"], None, group, True, T)
        with pytest.raises(ValueError, match=r"^residual: expected 2 rows"):
            ops.fused_layer(partial, i["residual"], i["post"], i["comb"], i["fn"], i["scale"],
                            i["base"], None, group, True, T)
        return "raised"
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        ops.fused_layer(partial, res, post, comb, i["fn"], i["scale"], i["base"], None, group, True, T)
    return time.monotonic() - start


def test_wrong_shape_on_one_rank_raises_and_peers_fail_in_time():
    results = run_world(4, worker_wrong_shape, timeout=COLLECTIVE_TIMEOUT_S * 6)
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


def test_rank_exiting_early_makes_peers_fail_not_hang():
    results = run_world(2, worker_early_exit, timeout=COLLECTIVE_TIMEOUT_S * 6, expect_exit={1})
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


def test_group_errors():
    assert run_world(2, worker_group_errors) == [True, True]


def test_world_of_one_without_torch_distributed():
    import mhc_sp.distributed as msd

    group = msd.init()
    T, n, H = 5, 4, 64
    i = random_inputs(T, n, H, seed=8)
    for sharded in (True, False):
        got = ops.fused_layer(i["x"], i["residual"], i["post"], i["comb"], i["fn"], i["scale"],
                              i["base"], i["norm_weight"], group, sharded, T)
        exp = R.fused_layer([i["x"]], [i["residual"]], [i["post"]], [i["comb"]], i["fn"], i["scale"],
                            i["base"], i["norm_weight"], sharded, T, CFG)[0]
        check_layer_outputs(got, exp, i, i["norm_weight"], f"world1 sharded={sharded}")
    x = torch.randn(6, 3)
    assert torch.equal(ops.all_gather(x, group), x) and ops.all_gather(x, group).data_ptr() != x.data_ptr()
    assert torch.equal(ops.reduce_scatter(x, group), x)
    assert torch.equal(ops.all_reduce(x, group), x)
    with pytest.raises(ValueError, match=r"^num_tokens: expected -1 or a value in \[0, 6\]"):
        ops.all_gather(x, group, 7)
    with pytest.raises(ValueError, match=r"^rank: expected a value in \[0, 2\)"):
        ops.shard_tokens(x, 2, 2)
    with pytest.raises(ValueError, match=r"^num_tokens: expected a value in \[0, 5\]"):
        ops.fused_layer(i["x"], i["residual"], i["post"], i["comb"], i["fn"], i["scale"], i["base"],
                        None, group, True, 6)
    with pytest.raises(TypeError, match="^x: expected dtype BFloat16"):
        ops.fused_entry(i["x"].float(), i["fn"], i["scale"], i["base"], None, group, True)
    with pytest.raises(ValueError, match=r"^fn: expected size 24 at dim 0"):
        ops.fused_entry(i["x"], i["head_fn"], i["scale"], i["base"], None, group, True)
    with pytest.raises(ValueError, match=r"^head_fn: expected size 4 at dim 0"):
        ops.fused_head(i["x"], i["residual"], i["post"], i["comb"], i["fn"], i["head_scale"],
                       i["head_base"], group, True, T)
    with pytest.raises(ValueError, match=r"^head_scale: expected size 1"):
        ops.fused_head(i["x"], i["residual"], i["post"], i["comb"], i["head_fn"], i["scale"],
                       i["head_base"], group, True, T)
    with pytest.raises(ValueError, match=r"^residual: expected 5 rows"):
        ops.fused_head(i["x"], i["residual"][:4].contiguous(), i["post"][:4].contiguous(),
                       i["comb"][:4].contiguous(), i["head_fn"], i["head_scale"], i["head_base"], group, False, T)
    msd.destroy()
    with pytest.raises(ValueError, match="not initialised with mhc_sp"):
        ops.all_reduce(x, group)
