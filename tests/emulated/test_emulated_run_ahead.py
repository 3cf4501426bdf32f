# SPDX-License-Identifier: Apache-2.0
"""Ranks that run ahead on the emulated device: every rank makes its whole sequence of calls on
its own host thread with no join between calls (World.run_sequences), so a fast rank starts call
k + 1 while a peer is still in call k, exactly the overlap the symm transport's two halves, three
Lamport mailboxes, re-arming order and epochs exist for. The sequences mix the Lamport and the
sharded boundaries, token counts, heads and collectives; one rank runs without pauses while the
others pause (seeded) before their calls and lag (their devices stall once through a cross-rank
barrier). Every output is checked bitwise, and each test asserts
that the overlap it is about really happened (counted from the kernels' start and end times), not
only that the results are right. Then programmatic dependent launch seen in the timeline, and a
captured graph of calls replayed with new inputs (the device's call counters move on, the host
issues nothing)."""

import random

import pytest
import torch

from mhc_sp import reference as R
from mhc_sp.testing import EMULATED_MODULE_MISSING, assert_bitwise
from tests.emulated.symm_world import (
    Boundary,
    E,
    H,
    emulated_device,
    no_errors,
    outputs,
    world,
)

pytestmark = pytest.mark.skipif(E is None, reason=EMULATED_MODULE_MISSING)


device = emulated_device(sms=4, blocks_per_sm=2, seed=11)


class AllReduce:
    """An all_reduce of tp ranks' rows: through the Lamport mailbox (few rows) or the exchange."""

    def __init__(self, tp, rows, seed):
        g = torch.Generator().manual_seed(seed)
        self.xs = [torch.randn(rows, H, generator=g).to(torch.bfloat16) for _ in range(tp)]
        for x in self.xs:
            x[:, :8] = -0.0  # the mailbox's empty marker: sent as +0

    def call(self, r):
        return ("all_reduce", (self.xs[r], None))

    def check(self, outs):
        for r, out in enumerate(outs):
            assert_bitwise(f"all_reduce rank {r}", out[0], R.sum_partials(self.xs))


class Collective:
    """reduce_scatter or all_gather of tp ranks' rows over the barrier exchange: one barrier per
    call, so a rank that is through it may push its next call while a peer still reads this one."""

    def __init__(self, tp, op, rows, seed):
        g = torch.Generator().manual_seed(seed)
        self.op, self.tp = op, tp
        self.xs = [torch.randn(rows, H, generator=g).to(torch.bfloat16) for _ in range(tp)]

    def call(self, r):
        if self.op == "all_gather":
            return ("all_gather", (self.xs[r], None, -1))
        return ("reduce_scatter", (self.xs[r], None))

    def check(self, outs):
        for r, out in enumerate(outs):
            if self.op == "all_gather":
                assert_bitwise(f"all_gather rank {r}", out[0], torch.cat(self.xs))
            else:
                want = R.shard_tokens(R.sum_partials(self.xs), r, self.tp)
                assert_bitwise(f"reduce_scatter rank {r}", out[0], want)


class Layer:
    def __init__(self, tp, T, sharded, seed, head=False):
        self.b, self.head = Boundary(tp, T, sharded, seed, zeros=seed % 2 == 0), head

    def call(self, r):
        return self.b.head_call(r) if self.head else self.b.layer_call(r)

    def check(self, outs):
        return self.b.check_head(outs) if self.head else self.b.check_layer(outs)


def mixed_steps(tp, seed, count):
    """A sequence every rank makes: Lamport (replicated, up to 16 tokens) and sharded boundaries,
    heads and all_reduces, token counts changing from call to call."""
    rng = random.Random(seed)
    steps = []
    for k in range(count):
        kind = rng.choice(["lamport", "sharded", "sharded", "lamport", "head", "all_reduce"])
        s = seed * 100 + k
        if kind == "all_reduce":
            steps.append(AllReduce(tp, rng.choice([3, 40]), s))
        elif kind == "head":
            steps.append(Layer(tp, rng.choice([tp + 1, 9]), True, s, head=True))
        else:
            T = rng.choice(
                [1, tp + 1, 7, 16] if kind == "lamport" else [tp - 1 or 1, tp + 1, 17, 37]
            )
            steps.append(Layer(tp, T, kind == "sharded", s))
    return steps


def run_steps(w, steps, pauses_us):
    tp = w.size
    results = w.run_sequences([[s.call(r) for s in steps] for r in range(tp)], pauses_us=pauses_us)
    outputs(results)
    for k, s in enumerate(steps):
        s.check([results[r][k] for r in range(tp)])
    return results


def calls_ahead(w):
    """How often a rank's kernels of call k + 1 started before a peer's kernels of call k had all
    ended: the kernels of a call are the launches of its rank's device that started while the
    call ran on the host (World.call_spans)."""
    spans, timeline = w.call_spans(), E.timeline()
    kernels = []  # per rank, per call: (first start, last end)
    for r, rank_spans in enumerate(spans):
        d = r  # world(tp) puts rank r on device r
        mine = [k for k in timeline if k["device"] == d]
        per_call = []
        for start, end in rank_spans:
            ks = [k for k in mine if start <= k["start_ns"] <= end]
            per_call.append((min(k["start_ns"] for k in ks), max(k["end_ns"] for k in ks)))
        kernels.append(per_call)
    ahead = 0
    for a in range(len(kernels)):
        for b in range(len(kernels)):
            if a != b:
                for k in range(min(len(kernels[a]), len(kernels[b])) - 1):
                    ahead += kernels[a][k + 1][0] < kernels[b][k][1]
    return ahead


# How long a lagging rank's blocks stall once through a cross-rank barrier: far longer than a
# fast rank takes to finish its call and launch the next on a loaded 2-core host.
LAG_US = 20_000


def run_ahead(tp, steps, pauses_us, tries=3):
    """Runs the sequence on a fresh world in which every rank that pauses before its calls also
    lags (its device stalls each block once it is through its first cross-rank barrier:
    configure_device's lag_us), so that the rank that never pauses finishes its call and starts
    the next while a lagging peer still reads this one. Each run is checked bitwise; up to `tries`
    runs until the overlap is counted (the host's timing still decides how far ranks drift)."""
    c = E.config()
    for r, pause in enumerate(pauses_us):
        if pause > 0:
            E.configure_device(r, c["sms"], c["blocks_per_sm"], lag_us=LAG_US)
    for _ in range(tries):
        w = world(tp)
        E.reset_launches()
        run_steps(w, steps, pauses_us)
        no_errors(w)
        if calls_ahead(w) > 0:
            return
    raise AssertionError(
        f"no rank started a call while a peer was in the one before ({tries} runs)"
    )


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_ranks_a_call_ahead_through_mixed_sequences(tp):
    run_ahead(tp, mixed_steps(tp, seed=tp, count=12), pauses_us=[0] + [400] * (tp - 1))


def test_every_lamport_mailbox_is_reused_while_a_peer_is_a_call_behind():
    """Nine Lamport boundaries in a row: each of the three mailboxes serves three calls, its slots
    re-armed by their reader while the writer may already be pushing its next call."""
    tp = 3
    steps = [Layer(tp, T, False, seed=500 + k) for k, T in enumerate([1, 5, 16, 2, 9, 3, 16, 1, 7])]
    run_ahead(tp, steps, pauses_us=[0, 800, 300])


def test_sharded_calls_alternate_halves_with_a_rank_ahead():
    """Sharded boundaries back to back: a fast rank's call k + 1 writes the other half while a
    slow peer still pulls call k's rows from this one."""
    tp = 2
    steps = [Layer(tp, T, True, seed=600 + k) for k, T in enumerate([3, 17, 37, 1, 9, 17, 4, 33])]
    run_ahead(tp, steps, pauses_us=[0, 800])


def test_one_barrier_collectives_alternate_halves_with_a_rank_ahead():
    """reduce_scatter and all_gather back to back: a rank through a call's only barrier pushes
    (or publishes) its next call into the other half while a slow peer still reads this one."""
    tp = 3
    ops = ["reduce_scatter", "all_gather", "all_gather", "reduce_scatter"] * 3
    steps = [Collective(tp, op, 6 + k % 5, seed=900 + k) for k, op in enumerate(ops)]
    run_ahead(tp, steps, pauses_us=[0, 600, 200])


def test_the_sharded_finish_starts_beside_its_projection():
    """The finish is a programmatic dependent of the projection: its blocks start once every
    projection block has triggered, before the projection grid ends (griddepcontrol.wait then
    holds them), in some call of the run."""
    tp = 2
    w = world(tp)
    E.reset_launches()
    run_steps(w, [Layer(tp, T, True, seed=700 + T) for T in (5, 17, 37, 9)], pauses_us=[0, 0])
    pairs = []
    for d in range(tp):
        mine = [k for k in E.timeline() if k["device"] == d]
        pairs += [(a, b) for a, b in zip(mine, mine[1:]) if b["dependent"]]
    assert len(pairs) == 4 * tp and not any(a["dependent"] for a, _ in pairs)
    assert any(b["start_ns"] < a["end_ns"] for a, b in pairs), pairs


@pytest.mark.parametrize("tp", [2, 3])
def test_a_captured_sequence_replays_with_new_inputs(tp):
    """The calls captured once as a graph per rank (nothing runs), then replayed three times, the
    inputs rewritten in place between replays as a graph's static inputs are: the call counters
    on the device move on (halves and mailboxes rotate) with no host involvement, and every
    replay's outputs are those of its inputs."""
    w = world(tp)
    steps = [
        Layer(tp, T, sharded, seed=800 + k)
        for k, (T, sharded) in enumerate(
            [(5, False), (9, True), (16, False), (tp + 1, True), (1, False)]
        )
    ]
    graphs, captured = w.capture([[s.call(r) for s in steps] for r in range(tp)])
    outputs(captured)
    g = torch.Generator().manual_seed(tp)
    for _replay in range(3):
        for s in steps:
            for p in s.b.partials:
                p.copy_(torch.randn(p.shape, generator=g).to(torch.bfloat16))
        errors = w.replay(graphs)
        assert errors == [None] * tp, errors
        for k, s in enumerate(steps):
            s.check([captured[r][k] for r in range(tp)])
    no_errors(w)
