# SPDX-License-Identifier: Apache-2.0
"""The symm transport's kernels on emulated devices: simulated ranks (mhc_sp._emulated.World),
each with its own device, buffer, workspace and communicator, each calling the production op
entries (fused_layer, fused_entry, fused_head, all_reduce, reduce_scatter, all_gather) on its own
host thread, as the ranks of a node do. Worlds of 2, 3, 4 and 8, token counts 1, tp - 1, tp + 1,
17 and 37, several calls in a row on one workspace (call counters, epochs, halves and mailboxes
re-armed and reused) switching between the Lamport boundary and the sharded one. Every output is
bitwise what the emulated mhc_post_pre (and mhc_pre, mhc_post, hc_head) gives for the fp32
rank-order sum of the partials (mhc_sp.reference.sum_partials); small cases also match
mhc_sp.reference at the contract's tolerances. Then the failures: an absent rank, a late one, a
mismatched call, a call on a broken workspace."""

import threading
import time

import pytest
import torch

from mhc_sp import reference as R
from mhc_sp.testing import EMULATED_MODULE_MISSING, assert_bitwise, pre_weights, random_inputs
from tests.emulated.symm_world import (
    CFG,
    Boundary,
    C,
    E,
    H,
    N,
    all_nan,
    emulated_device,
    no_errors,
    outputs,
    token_counts,
    world,
)
from tests.helpers.boundaries import (
    check_absent_rank_named,
    check_refused_after_absent,
    symm_collective_cases,
)

pytestmark = pytest.mark.skipif(E is None, reason=EMULATED_MODULE_MISSING)


device = emulated_device(sms=4, blocks_per_sm=2, seed=5)


# tp 8 (9 s here) in the slow set: the tp 8 kernels run in the default set through fused_entry and
# fused_head, and the rotation of halves and mailboxes is the same at every tp.
@pytest.mark.parametrize("tp", [2, 3, 4, pytest.param(8, marks=pytest.mark.slow)])
def test_fused_layer_calls_in_a_row(tp):
    """Per token count: sharded, replicated, sharded again on one workspace, so that every call
    uses the other half or the next mailbox and the re-armed slots of two calls before; the
    replicated calls of up to 16 tokens take the Lamport boundary, the others the composed path
    over the symm collectives."""
    w = world(tp)
    for T in token_counts(tp):
        for k, sharded in enumerate((True, False, True)):
            b = Boundary(tp, T, sharded, seed=1000 * tp + 10 * T + k, zeros=k == 1)
            b.check_layer(outputs(w.run([b.layer_call(r) for r in range(tp)])), reference=T <= 2)
    no_errors(w)


def test_each_call_advances_its_counter_once_and_clears_its_arrivals():
    """The device's bookkeeping after a sequence of boundaries: every Lamport call advanced
    lamport_calls once and every sharded one exchange_calls once, and the arrival counts and the
    decode tile counter are back at zero (a count left behind makes a later call's last block run
    early or never, which the results show only under some schedules)."""
    tp = 2
    w = world(tp)
    for k, (T, sharded) in enumerate([(T, s) for T in (1, 3, 16, 5) for s in (False, True)]):
        b = Boundary(tp, T, sharded, seed=2000 + k)
        b.check_layer(outputs(w.run([b.layer_call(r) for r in range(tp)])))
    idle = {"lamport_done": 0, "exchange_done": 0, "tile_counter": 0}
    assert w.local_states() == [{"lamport_calls": 4, "exchange_calls": 4, **idle}] * tp
    no_errors(w)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 13))
def test_other_thread_orders_give_the_same_bits(seed):
    """The emulation's seed changes the order in which every block runs its threads (and so
    which blocks of which ranks get ahead): the protocol's results must not depend on it."""
    E.configure(sms=3, blocks_per_sm=2, seed=seed)
    tp = 3
    w = world(tp)
    for k, (T, sharded) in enumerate(((4, False), (7, True), (16, False), (37, True))):
        b = Boundary(tp, T, sharded, seed=seed * 10 + k)
        b.check_layer(outputs(w.run([b.layer_call(r) for r in range(tp)])))
    no_errors(w)


def test_the_boundaries_take_the_kernels_they_are_meant_to():
    tp = 4
    w = world(tp)
    for T, sharded, grids in ((5, False, 1), (5, True, 2)):  # Lamport: one kernel; sharded: A + B
        b = Boundary(tp, T, sharded, seed=T)
        E.reset_launches()
        outputs(w.run([b.layer_call(r) for r in range(tp)]))
        assert len(E.launches()) == grids * tp, E.launches()


@pytest.mark.parametrize("sharded", [False, True])
def test_the_sum_is_in_rank_order_where_the_order_shows(sharded):
    """Partials of very different magnitudes (2^20, 1, -2^20 times random rows), so that fp32
    sums in other orders give other bits: every rank's outputs are bitwise those of the rank-order
    sum (Lamport mailbox and barrier exchange alike), and the data really tells the orders apart."""
    tp, T = 3, 7
    b = Boundary(tp, T, sharded, seed=77)
    for r, scale in enumerate((2.0**20, 1.0, -(2.0**20))):
        b.partials[r][:T] = (b.partials[r][:T].float() * scale).to(torch.bfloat16)
    rows = [p[:T] for p in b.partials]
    assert not torch.equal(R.sum_partials(rows), R.sum_partials(rows[::-1])), "orders look alike"
    w = world(tp)
    b.check_layer(outputs(w.run([b.layer_call(r) for r in range(tp)])))
    no_errors(w)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 8])
def test_every_hc_mult_takes_the_symm_kernels(n):
    """hc_mult 4 runs everywhere above; every other hc_mult the symm dispatch compiles (1 to 8)
    takes its Lamport kernel and its two sharded kernels here, bitwise as hc_mult 4 does."""
    tp = 2
    w = world(tp)
    for T, sharded, grids in ((3, False, 1), (5, True, 2), (2, True, 2)):
        b = Boundary(tp, T, sharded, seed=50 + n + T, zeros=T == 3, n=n)
        E.reset_launches()
        outs = outputs(w.run([b.layer_call(r) for r in range(tp)]))
        assert len(E.launches()) == grids * tp, E.launches()
        b.check_layer(outs)
    no_errors(w)


def test_every_symm_call_on_a_device_waits_for_the_one_before():
    """The device's call order (symm::CallOrder): every call of every group on a device waits for
    the device's one event and records it after its kernels, so two groups' kernels never spin on
    one GPU at the same time and run in the order the host issued them."""
    a, b = world(2, devices=[5, 6]), world(2, devices=[5, 7])  # both groups use device 5
    boundary = Boundary(2, 3, True, seed=3)
    E.reset_events()
    for w in (a, b, a):
        outputs(w.run([boundary.layer_call(r) for r in range(2)]))
    by_device = {}
    for device, what, event in E.events():
        by_device.setdefault(device, []).append((what, event))
    assert sorted(by_device) == [5, 6, 7], by_device
    for device, calls in ((5, 3), (6, 2), (7, 1)):
        ops = by_device[device]
        assert [w for w, _ in ops] == ["wait", "record"] * calls, (device, ops)
        assert len({e for _, e in ops}) == 1, (device, ops)  # one event per device
    assert len({ops[0][1] for ops in by_device.values()}) == 3  # and one device per event


@pytest.mark.parametrize("call", ["lamport", "sharded", "all_reduce"])
def test_ranks_with_other_launch_plans_report_a_mismatch(call):
    """A rank whose GPU is another size (MIG, MPS shares, mixed SKUs) computes another grid and
    split, and block b would no longer meet the rows block b of every peer moved. The plan is part
    of the call header and the Lamport tag: every rank reports the mismatch and nobody returns a
    row computed from the wrong data (every output is NaN)."""
    E.configure_device(11, sms=1, blocks_per_sm=1)  # rank 1's GPU: one block at a time
    w = world(2, devices=[10, 11])
    if call == "all_reduce":
        x = torch.randn(2 * C["default_mailbox_slot_bytes"] // (2 * H) + 3, H).to(torch.bfloat16)
        calls = [("all_reduce", (x, None))] * 2
    else:
        calls = [Boundary(2, 5, call == "sharded", seed=3).layer_call(r) for r in range(2)]
    outs = w.run(calls)
    errors = w.errors()
    assert all(e is not None and e["code"] == "mismatch" for e in errors), errors
    for out in outs:
        assert not isinstance(out, Exception) and all(all_nan(t) for t in out), out


def test_calls_from_two_host_threads_take_turns_on_a_device():
    """Two host threads with a group each on one device (worlds of one: nothing to wait for):
    the device's order is held from a call's wait to its record, so the two threads' calls never
    interleave their event operations."""
    groups = [world(1, devices=[9]), world(1, devices=[9])]
    b = Boundary(1, 3, False, seed=4)
    E.reset_events()
    failures = []

    def calls(w):
        for _ in range(6):
            out = w.run([b.layer_call(0)])[0]
            if isinstance(out, Exception):
                failures.append(out)

    threads = [threading.Thread(target=calls, args=(w,)) for w in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert [what for device, what, _ in E.events() if device == 9] == ["wait", "record"] * 12


def test_the_ranks_of_a_world_need_their_own_devices():
    with pytest.raises(ValueError, match="^devices: every rank needs its own emulated device"):
        world(2, devices=[3, 3])


@pytest.mark.parametrize("tp,T", [(2, 7), (3, 17), (4, 5)])
def test_sharded_rows_equal_the_replicated_rows(tp, T):
    """One stream held whole by every rank (replicated: the Lamport boundary up to 16 tokens, else
    the composed one) and the same stream sharded over the ranks: every rank's shard rows are
    bitwise the replicated rows, and the gathered layer input is the replicated one."""
    w = world(tp)
    full = random_inputs(T, N, H, seed=T + tp)
    stream = [full[k] for k in ("residual", "post", "comb")]
    g = torch.Generator().manual_seed(tp)
    partials = [torch.randn(T, H, generator=g).to(torch.bfloat16) for _ in range(tp)]

    def call(r, sharded):
        own = [R.shard_tokens(t, r, tp).contiguous() for t in stream] if sharded else stream
        args = (partials[r], *own, *pre_weights(full), None, sharded, T, *CFG.scalars())
        return ("fused_layer", args)

    replicated = outputs(w.run([call(r, False) for r in range(tp)]))
    sharded = outputs(w.run([call(r, True) for r in range(tp)]))
    shard = -(-T // tp)
    for r in range(tp):
        rows = slice(r * shard, min(T, (r + 1) * shard))
        v = rows.stop - rows.start if rows.stop > rows.start else 0
        for name, a, b in zip(("residual_out", "post", "comb"), sharded[r][:3], replicated[r][:3]):
            assert_bitwise(f"rank {r} {name}", a[:v], b[rows])
        assert_bitwise(f"rank {r} layer_input", sharded[r][3], replicated[r][3])
    no_errors(w)


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
@pytest.mark.parametrize("sharded", [False, True])
def test_fused_entry_and_head(tp, sharded):
    w = world(tp)
    for T in (1, tp + 1, 17):
        inp = random_inputs(T, N, H, seed=T + tp)
        entry = ("fused_entry", (inp["x"], *pre_weights(inp), None, sharded, *CFG.scalars()))
        outs = outputs(w.run([entry] * tp))
        full = E.mhc_pre_broadcast(inp["x"], *pre_weights(inp), *CFG.scalars())
        for r, out in enumerate(outs):
            mine = (lambda t: R.shard_tokens(t, r, tp)) if sharded else (lambda t: t)  # noqa: E731
            for name, got, want in zip(("residual", "post", "comb"), out[:3], full[:3]):
                assert_bitwise(f"rank {r} entry {name}", got, mine(want))
            assert_bitwise(f"rank {r} entry layer_input", out[3], full[3])
        b = Boundary(tp, T, sharded, seed=T + 7)
        b.check_head(outputs(w.run([b.head_call(r) for r in range(tp)])))
    no_errors(w)


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_collectives(tp):
    w = world(tp)
    exchange_rows = 2 * C["default_mailbox_slot_bytes"] // (2 * H) + 3
    g = torch.Generator().manual_seed(tp)
    for op, xs, keep, want in symm_collective_cases(tp, H, exchange_rows, g):
        args = [(x, None, keep) if op == "all_gather" else (x, None) for x in xs]
        for r, out in enumerate(outputs(w.run([(op, a) for a in args]))):
            assert_bitwise(f"{op} rows {xs[0].shape[0]} keep {keep} rank {r}", out[0], want(r))
    no_errors(w)


# ---- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("sharded", [False, True])
def test_absent_rank_times_out_then_every_call_is_refused(tp, sharded):
    timeout = 0.2
    w = world(tp, timeout=timeout)
    b = Boundary(tp, 2 * tp + 1 if sharded else 16, sharded, seed=60)
    absent = tp - 1
    calls = [b.layer_call(r) if r != absent else None for r in range(tp)]
    t = time.monotonic()
    outs = outputs(w.run(calls))
    first = time.monotonic() - t
    check_absent_rank_named(w, tp, absent, outs)
    # The absent rank arrives now: its kernels find the workspace broken, record the refusal
    # (naming the rank that broke it) and return NaN.
    (late,) = [
        out
        for r, out in enumerate(
            w.run([b.layer_call(r) if r == absent else None for r in range(tp)])
        )
        if r == absent
    ]
    assert not isinstance(late, Exception), late
    check_refused_after_absent(w, absent, [late])
    # Every rank's next eager op raises, naming the peer.
    for r, out in enumerate(w.run([b.layer_call(r) for r in range(tp)])):
        assert isinstance(out, RuntimeError) and "rank" in str(out), (r, out)
    assert first < 20 * timeout + 5, first


@pytest.mark.parametrize("sharded", [False, True])
def test_a_late_rank_within_the_timeout_gives_the_right_result(sharded):
    tp = 3
    w = world(tp, timeout=10.0)
    b = Boundary(tp, 5, sharded, seed=70)
    outs = outputs(w.run([b.layer_call(r) for r in range(tp)], delays_s=[0.0, 0.3, 0.0]))
    b.check_layer(outs)
    no_errors(w)


@pytest.mark.parametrize("sharded", [False, True])
def test_a_mismatched_call_is_reported_by_every_rank(sharded):
    tp = 3
    w = world(tp, timeout=5.0)
    b = Boundary(tp, 7, sharded, seed=80)
    outputs(w.run([b.layer_call(r) for r in range(tp)]))  # a good call first
    calls = [b.layer_call(r) for r in range(tp)]
    calls[1] = Boundary(tp, 5, sharded, seed=81).layer_call(1)  # 5 tokens where the others have 7
    outs = w.run(calls)
    errors = w.errors()
    assert all(e is not None and e["code"] == "mismatch" for e in errors), errors
    for out in outs:
        assert not isinstance(out, Exception) and all(all_nan(t_) for t_ in out)


def test_a_mismatched_op_is_reported_by_every_rank():
    tp = 2
    w = world(tp, timeout=5.0)
    b = Boundary(tp, 9, True, seed=90)
    x = torch.ones(9, H, dtype=torch.bfloat16)
    outs = w.run([b.layer_call(0), ("reduce_scatter", (x, None))])
    errors = w.errors()
    assert all(e is not None and e["code"] == "mismatch" for e in errors), errors
    assert all(not isinstance(o, Exception) for o in outs)


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_a_collective_on_a_broken_workspace_is_nan(op):
    """Rank 1 never arrives at an all_reduce, so rank 0 breaks the workspace; rank 1 then calls
    `op`: its kernels refuse it (kPeerBroken naming rank 0) and its output is NaN; its next eager
    op raises."""
    tp = 2
    w = world(tp, timeout=0.2)
    x = torch.ones(40, H, dtype=torch.bfloat16)
    w.run([("all_reduce", (x, None)), None])
    args = (x, None, -1) if op == "all_gather" else (x, None)
    (_, out) = w.run([None, (op, args)])
    assert not isinstance(out, Exception) and all_nan(out[0]), out
    rec = w.errors()[1]
    assert rec["code"] == "peer_broken" and rec["peer"] == 0, rec
    (_, again) = w.run([None, (op, args)])
    assert isinstance(again, RuntimeError) and "refused the call" in str(again), again
