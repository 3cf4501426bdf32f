# SPDX-License-Identifier: Apache-2.0
"""The shm transport's protocol on a spawned world of 3 ranks (on the 2 cores of CI): 1,000
back-to-back calls with changing token counts (epochs reused, the workspace grown), ranks that
disagree on a call, a stalled rank, the V4 model's SP check, and a rank killed in the middle of a
call. Correctness of every op against the reference and gloo is in test_sp_ops.py."""

import os
import re
import signal
import threading
import time
from datetime import timedelta

import pytest
import torch

import mhc_sp.distributed as msd
from mhc_sp import ops
from mhc_sp import reference as R
from mhc_sp.engine.config import ParallelConfig
from mhc_sp.local_world import run_world
from mhc_sp.testing import head_weights, pre_weights, random_inputs
from tests.helpers.boundaries import partials_for

TIMEOUT_S = 4.0  # the workspace's timeout in these worlds: a stalled peer fails within it


def back_to_back(rank, world, group, calls=1000):
    """`calls` calls of every shm op with token counts drawn from one seeded stream (the same on
    every rank), some large enough to grow the workspace (1 MiB per slot half at first). The
    reductions are checked bit for bit on every call (integer-valued data sums exactly in any
    order), the fused ops against the reference on every 25th call and every large one."""
    gen = torch.Generator().manual_seed(1234)
    H, n = 32, 4
    kinds = (
        "layer_sharded",
        "layer_replicated",
        "head_sharded",
        "entry_sharded",
        "all_reduce",
        "all_gather",
        "reduce_scatter",
    )
    largest = 0
    for call in range(calls):
        kind = kinds[int(torch.randint(len(kinds), (1,), generator=gen))]
        big = int(torch.randint(40, (1,), generator=gen)) == 0
        T = int(torch.randint(17000 if big else 40, (1,), generator=gen))
        largest = max(largest, T)
        tag = f"[call {call} {kind} T={T} rank={rank}]"
        if kind in ("all_reduce", "all_gather", "reduce_scatter"):
            value = lambda r: float(r + 1 + call % 5)  # noqa: E731
            x = torch.full((T, H), value(rank), dtype=torch.bfloat16)
            total = torch.full_like(x, sum(value(r) for r in range(world)))
            if kind == "all_reduce":
                assert torch.equal(ops.all_reduce(x, group), total), tag
            elif kind == "reduce_scatter":
                own = R.shard_tokens(total, rank, world)
                assert torch.equal(ops.reduce_scatter(x, group), own), tag
            else:
                every = torch.cat([torch.full_like(x, value(r)) for r in range(world)])
                assert torch.equal(ops.all_gather(x, group), every), tag
            continue
        # Checked bit for bit against the single-process ops on all T rows and the rank-order
        # sum (CPU kernels are batch invariant), on every 25th call and every large one.
        verify = call % 25 == 0 or big
        i = random_inputs(T, n, H, seed=call)
        sharded = kind != "layer_replicated"
        rows = -(-T // world) if sharded else T
        first, valid = (rank * rows, max(0, min(rows, T - rank * rows))) if sharded else (0, T)
        res, post, comb = (
            (R.shard_tokens(i[k], rank, world) if sharded else i[k])
            for k in ("residual", "post", "comb")
        )
        partials = partials_for(world, T, H, seed=call)
        x = R.sum_partials(partials)
        if kind == "entry_sharded":
            proj = pre_weights(i)
            got = ops.fused_entry(i["x"], *proj, group, True)
            full = verify and ops.mhc_pre_broadcast(i["x"], *proj)
            stream_outputs, gathered = (0, 1, 2), 3
        elif kind == "head_sharded":
            got = ops.fused_head(
                partials[rank],
                res,
                post,
                comb,
                *head_weights(i),
                group,
                True,
                T,
            )
            if verify:
                stream = ops.mhc_post(x, i["residual"], i["post"], i["comb"])
                full = (ops.hc_head(stream, *head_weights(i)), stream)
            stream_outputs, gathered = (1,), 0
        else:
            got = ops.fused_layer(
                partials[rank],
                res,
                post,
                comb,
                *pre_weights(i),
                group,
                sharded,
                T,
            )
            full = verify and ops.mhc_post_pre(
                x,
                i["residual"],
                i["post"],
                i["comb"],
                *pre_weights(i),
            )
            stream_outputs, gathered = (0, 1, 2), 3
        if verify:
            assert torch.equal(got[gathered], full[gathered]), tag
            for k in stream_outputs:
                own = full[k][first : first + valid]
                assert torch.equal(got[k][:valid], own), f"{tag} output {k}"
                assert torch.count_nonzero(got[k][valid:]) == 0, f"{tag} output {k} padding rows"
    return largest


def worker_protocol(rank, world):
    group = msd.init(device="cpu", transport="shm", timeout=TIMEOUT_S)
    assert msd.transport(group, "cpu") == "shm"
    H = 16
    report = {}

    # Epoch reuse and growth over many calls; 17000 x 32 bf16 rows need 1.1 MiB per slot half.
    start = time.monotonic()
    assert back_to_back(rank, world, group) * 32 * 2 > 1 << 20
    report["back_to_back_s"] = time.monotonic() - start

    # Ranks that disagree on a call all raise, naming what differs; the workspace is then broken
    # until init runs again on every rank.
    i = random_inputs(6, 4, H, seed=1)
    T = 5 + (rank == 1)
    partial = partials_for(world, 6, H, seed=2)[rank]
    res, post, comb = (R.shard_tokens(i[k][:T], rank, world) for k in ("residual", "post", "comb"))
    with pytest.raises(
        ValueError,
        match=r"^num_tokens: ranks disagree on fused_layer: rank 0 "
        r"passed 5, rank 1 passed 6",
    ):
        ops.fused_layer(
            partial, res, post, comb, i["fn"], i["scale"], i["base"], None, group, True, T
        )
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="workspace is broken"):
        ops.all_reduce(partial, group)
    assert time.monotonic() - start < 0.5, "a broken workspace must fail at once"
    group = msd.init(device="cpu", transport="shm", timeout=TIMEOUT_S)
    x = torch.ones(3, H)
    assert torch.equal(ops.all_reduce(x, group), x * world)
    with pytest.raises(
        ValueError,
        match=r"^group: ranks disagree on all_reduce: rank 0 called "
        r"all_reduce as call \d+, rank 1 called all_gather",
    ):
        ops.all_reduce(x, group) if rank != 1 else ops.all_gather(x, group)
    group = msd.init(device="cpu", transport="shm", timeout=TIMEOUT_S)
    with pytest.raises(
        ValueError,
        match=r"^x: ranks disagree on all_gather: rank 0 passed 3 rows "
        r"of 16 elements, rank 2 passed 3 rows of 8",
    ):
        ops.all_gather(torch.ones(3, 8 if rank == 2 else H), group)
    # The timeout given through a TransportConfig, as a timedelta, holds as timeout= does.
    config = msd.TransportConfig(timeout=timedelta(seconds=TIMEOUT_S))
    group = msd.init(device="cpu", transport="shm", config=config)

    # A stalled rank: its peers give up within the timeout and say who they waited for.
    if rank == 1:
        time.sleep(TIMEOUT_S + 1.0)
        with pytest.raises(RuntimeError, match="gave up"):
            ops.all_reduce(x, group)
    else:
        start = time.monotonic()
        # The first rank to give up says so, the others that it gave up while rank 1 was missing.
        with pytest.raises(
            RuntimeError, match=r"rank 1 did not (reach all_reduce|arrive) within 4 s"
        ):
            ops.all_reduce(x, group)
        report["stall_s"] = time.monotonic() - start
    group = msd.init(device="cpu", transport="shm", timeout=TIMEOUT_S)

    report["model"] = model_check(rank, world)

    # A rank killed in the middle of a call: it loops fused_layer while a timer kills it.
    group = msd.init(device="cpu", transport="shm", timeout=TIMEOUT_S)
    T, H = 512, 256
    i = random_inputs(T, 4, H, seed=3)
    partial = partials_for(world, T, H, seed=4)[rank]
    res, post, comb = (R.shard_tokens(i[k], rank, world) for k in ("residual", "post", "comb"))

    def call():
        return ops.fused_layer(
            partial,
            res,
            post,
            comb,
            *pre_weights(i),
            group,
            True,
            T,
        )

    if rank == 2:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
        while True:
            call()
    calls, last = 0, time.monotonic()
    with pytest.raises(RuntimeError) as err:
        while True:
            call()
            calls, last = calls + 1, time.monotonic()
    report["detect_s"] = time.monotonic() - last
    # Seen first hand, or through a peer that saw it first.
    seen = r"rank 2 (\(pid \d+\) exited during fused_layer|exited or left the workspace, so)"
    assert re.search(seen, str(err.value)), err
    with pytest.raises(RuntimeError, match="workspace is broken"):
        call()
    report["calls_before_kill"] = calls
    return report


def model_check(rank, world):
    """The V4 model's SP forward on the shm transport matches the tp=1 model (runner tolerance)."""
    from mhc_sp.engine.model import RoutingTrace, TPContext
    from mhc_sp.engine.runner import (
        ModelRunner,
        ParallelGroups,
        init_parallel_groups,
        logits_tolerance,
    )
    from tests.helpers.engines import TINY, engine

    groups = init_parallel_groups(ParallelConfig(world), "cpu")
    assert msd.transport(groups.tp.group, "cpu") == "shm"
    one = ParallelGroups(TPContext(0, 1, groups.self_group), self_group=groups.self_group)
    runner, ref = ModelRunner(engine(world, sp=4), groups), ModelRunner(engine(1), one)
    ids = torch.randint(0, TINY.vocab_size, (11,), generator=torch.Generator().manual_seed(5))
    trace = RoutingTrace()
    out = runner.forward(ids, routing=trace)
    assert out.plan.sharded
    r = ref.forward(ids, routing=RoutingTrace([t.cpu() for t in trace.recorded]))
    diff = (out.logits - r.logits).abs().max().item()
    assert diff <= logits_tolerance(TINY.num_layers, r.logits), diff
    return True


@pytest.mark.distributed
def test_protocol_growth_mismatch_stall_model_and_killed_rank():
    results = run_world(3, worker_protocol, expect_exit={2}, timeout=180, start="forkserver")
    assert results[2] is None  # killed
    for r in (0, 1):
        report = results[r]
        assert report["model"] is True
        assert report["calls_before_kill"] >= 1
        # Death is seen through the peer's pid in milliseconds, not after the timeout.
        assert report["detect_s"] < TIMEOUT_S / 2, report
    assert TIMEOUT_S <= results[0]["stall_s"] < TIMEOUT_S + 2, results[0]


def test_transport_arguments():
    """Checked before anything is registered or exchanged (here on a world of one)."""
    with pytest.raises(
        ValueError, match=r"^transport: expected one of 'auto', 'shm', 'gloo' for device 'cpu'"
    ):
        msd.init(device="cpu", transport="nvlink")
    with pytest.raises(ValueError, match=r"^transport: 'shm' does not serve cuda tensors"):
        msd.init(device="cuda", transport="shm")
    with pytest.raises(ValueError, match=r"^transport: 'nccl' does not serve cpu tensors"):
        msd.init(device="cpu", transport="nccl")
    with pytest.raises(TypeError, match=r"^transport: expected a str"):
        msd.init(device="cpu", transport=None)
    with pytest.raises(ValueError, match=r"^device: expected 'cpu' or 'cuda'"):
        msd.init(device="meta")
    with pytest.raises(TypeError, match=r"^device: expected a str, a torch.device or None"):
        msd.init(device=0)
    with pytest.raises(ValueError, match=r"^timeout: expected a positive, finite duration"):
        msd.init(device="cpu", timeout=0)
    with pytest.raises(TypeError, match=r"^timeout: expected seconds or a timedelta"):
        msd.init(device="cpu", timeout="10")
    # TransportConfig: checked when it is made, and against the device and timeout= by init.
    with pytest.raises(ValueError, match=r"^timeout: expected a positive, finite duration"):
        msd.TransportConfig(timeout=-1.0)
    with pytest.raises(ValueError, match=r"^half_bytes: expected at least 4096 bytes, got 100"):
        msd.TransportConfig(half_bytes=100)
    with pytest.raises(TypeError, match=r"^mailbox_slot_bytes: expected an int number of bytes"):
        msd.TransportConfig(mailbox_slot_bytes=1.5)
    with pytest.raises(TypeError, match=r"^config: expected a mhc_sp.distributed.TransportConfig"):
        msd.init(device="cpu", config={"timeout": 5})
    with pytest.raises(ValueError, match=r"^timeout: given both as timeout= and in config"):
        msd.init(device="cpu", timeout=5, config=msd.TransportConfig(timeout=5))
    with pytest.raises(
        ValueError, match=r"^config: half_bytes and mailbox_slot_bytes size the symm"
    ):
        msd.init(device="cpu", config=msd.TransportConfig(half_bytes=1 << 20))
    with pytest.raises(ValueError, match="'nope' is not initialised with mhc_sp"):
        msd.transport("nope", "cpu")
    group = msd.init(device="cpu", transport="shm")
    assert msd.transport(group, "cpu") == "local"  # a world of one exchanges nothing
    with pytest.raises(ValueError, match=r"^device: expected 'cpu' or 'cuda'"):
        msd.transport(group, "xla")
    msd.destroy()
