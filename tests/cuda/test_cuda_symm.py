# SPDX-License-Identifier: Apache-2.0
"""The symm transport's kernels on one GPU (skipped without one; bash bench/gpu_check.sh runs it).

Two ways to run them here, through the device code production runs:
  - simulated ranks (mhc_sp._testing.SymmSimGroup, the testing module): tp ranks in one
    cooperative launch, each with its own buffer, pointer table, error record and inputs
    (distinct streams, coefficients and partials per rank);
  - the production launch (`production=True`, a world of one): one rank, no cooperative launch,
    the sharded finish a programmatic dependent launch, eager and captured in CUDA graphs.
Every output is bitwise the CUDA mhc_post_pre of the fp32 rank-order sum of the partials (the same
kernels), the coefficients are bitwise mhc_pre of the call's own residual_out (docs/design.md §1)
and small cases match mhc_sp.reference on the CPU at the contract's tolerances. Failures: a rank
that never arrives makes the others record a timeout naming it with NaN outputs, and a later call
on the broken workspace is refused on every rank (kPeerBroken, NaN outputs)."""

import time

import pytest
import torch

from mhc_sp import _C, ops
from mhc_sp import reference as R
from mhc_sp.config import MhcConfig
from mhc_sp.testing import (
    assert_bitwise,
    assert_close,
    bits,
    load_testing_module,
    pre_weights,
    random_inputs,
)
from tests.helpers.boundaries import (
    RankRows,
    check_absent_rank_named,
    check_refused_after_absent,
    symm_collective_cases,
)

_testing = load_testing_module()
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not hasattr(_testing, "SymmSimGroup"),
    reason="needs a GPU and a CUDA build of mhc_sp with its testing module (MHC_SP_TESTING=1)",
)

N = 4  # hc_mult: V4
H = 7168  # V4-Pro
CFG = MhcConfig()
C = _C.symm_constants()
WAIT_S = 5.0  # the simulated groups' timeout: a broken wait fails fast


def group(tp: int, max_sharded_tokens: int = 1024, hidden: int = H, timeout: float = WAIT_S):
    need = _testing.symm_exchange_layout(
        "fused_layer", True, max_sharded_tokens, max_sharded_tokens, hidden, 2, tp
    )["need"]
    return _testing.SymmSimGroup(
        tp,
        torch.cuda.current_device(),
        C["default_mailbox_slot_bytes"],
        max(need, 1 << 20),
        timeout,
    )


class Case(RankRows):
    """One boundary call's inputs for tp ranks: shared pre weights, and per rank its own partial
    (num_tokens + extra rows, garbage past num_tokens), stream, post and comb (replicated: all
    num_tokens rows; sharded: the rank's shard of its own full stream, padding rows zero)."""

    def __init__(self, tp, T, sharded, seed, hidden=H, extra=0, zeros=0.0):
        self.tp, self.T, self.sharded, self.H = tp, T, sharded, hidden
        self.w = random_inputs(T, N, hidden, seed=seed, device="cuda")
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        self.partials, self.residuals, self.posts, self.combs = [], [], [], []
        for r in range(tp):
            own = random_inputs(T, N, hidden, seed=seed + 10 + r, device="cuda")
            p = torch.randn(T + extra, hidden, generator=g, device="cuda").to(torch.bfloat16)
            p[T:] = 1e4  # rows past num_tokens must be ignored
            if zeros:
                mask = torch.rand(T, hidden, generator=g, device="cuda") < zeros
                signs = torch.rand(T, hidden, generator=g, device="cuda") < 0.5
                z = torch.where(signs, -0.0, 0.0).to(device="cuda", dtype=torch.bfloat16)
                p[:T] = torch.where(mask, z, p[:T])
                p[:T, : min(hidden, 64)] = -0.0  # every rank sends -0: the sum is +0
            self.partials.append(p)
            self.residuals.append(self.mine(own["residual"], r))
            self.posts.append(self.mine(own["post"], r))
            self.combs.append(self.mine(own["comb"], r))

    def run(self, sim, **kw):
        return sim.fused_layer(
            self.partials,
            self.residuals,
            self.posts,
            self.combs,
            *pre_weights(self.w),
            self.sharded,
            self.T,
            *CFG.scalars(),
            **kw,
        )

    def expected(self, r):
        """mhc_post_pre (CUDA) of rank r's real rows, x the rank-order sum."""
        x = R.sum_partials([p[: self.T] for p in self.partials])
        if self.sharded:
            x = R.shard_tokens(x, r, self.tp)
        v = self.valid(r)
        stream = (x[:v], self.residuals[r][:v], self.posts[r][:v], self.combs[r][:v])
        return ops.mhc_post_pre(*stream, *pre_weights(self.w))

    def check(self, outs, cpu_reference=False):
        gathered = []
        for r, out in enumerate(outs):
            v = self.valid(r)
            want = self.expected(r)
            for name, got, w in zip(("residual_out", "post", "comb"), out[:3], want[:3]):
                assert_bitwise(f"rank {r} {name}", got[:v], w)
                assert int(torch.count_nonzero(got[v:])) == 0, f"rank {r} {name} padding rows"
            # The coefficients and layer_input are the pre of the call's own residual_out.
            own = ops.mhc_pre(out[0][:v], *pre_weights(self.w))
            for name, got, w in zip(("post", "comb"), out[1:3], own[:2]):
                assert_bitwise(f"rank {r} {name} vs mhc_pre(residual_out)", got[:v], w)
            if self.sharded:
                gathered.append(want[3])
            else:
                assert_bitwise(f"rank {r} layer_input", out[3], want[3])
                assert_bitwise(f"rank {r} layer_input vs mhc_pre(residual_out)", out[3], own[2])
            if cpu_reference and v:
                self.check_reference(r, out, v)
        if self.sharded:
            for r, out in enumerate(outs):
                assert_bitwise(f"rank {r} gathered layer_input", out[3], torch.cat(gathered))

    def check_reference(self, r, out, v):
        x = R.sum_partials([p[: self.T].cpu() for p in self.partials])
        if self.sharded:
            x = R.shard_tokens(x, r, self.tp)
        fn, scale, base, norm = (t.cpu() for t in pre_weights(self.w))
        stream = (self.residuals[r][:v].cpu(), self.posts[r][:v].cpu(), self.combs[r][:v].cpu())
        ref = R.mhc_post_pre(x[:v], *stream, fn, scale, base, norm, CFG)
        residual = out[0][:v].cpu()
        assert_close(residual, ref[0], f"rank {r} residual_out")
        own = R.mhc_pre(residual, fn, scale, base, norm, CFG)
        assert_close(out[1][:v].cpu(), own[0], f"rank {r} post")
        assert_close(out[2][:v].cpu(), own[1], f"rank {r} comb")
        start = r * self.shard() if self.sharded else 0
        assert_close(out[3][start : start + v].cpu(), ref[3], f"rank {r} layer_input")


def no_errors(sim):
    errors = [e for e in sim.errors() if e is not None]
    assert not errors, f"errors recorded: {errors}"


# ---- simulated ranks -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sims():
    made = {}

    def get(tp):
        if tp not in made:
            made[tp] = group(tp)
        return made[tp]

    yield get
    made.clear()


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("T", [1, 3, 16])
def test_replicated_decode(sims, tp, T):
    case = Case(tp, T, False, seed=tp * 100 + T)
    case.check(case.run(sims(tp)), cpu_reference=T <= 3)
    no_errors(sims(tp))


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_replicated_other_hidden_size(sims, tp):
    case = Case(tp, 7, False, seed=7, hidden=4096)
    case.check(case.run(sims(tp)))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("T", ["1", "tp-1", "tp+1", "1000"])
def test_sharded(sims, tp, T):
    tokens = {"1": 1, "tp-1": max(1, tp - 1), "tp+1": tp + 1, "1000": 1000}[T]
    case = Case(tp, tokens, True, seed=tp * 1000 + tokens, extra=3)
    case.check(case.run(sims(tp)), cpu_reference=tokens <= 16)
    no_errors(sims(tp))


@pytest.mark.parametrize("tp", [2, 8])
@pytest.mark.parametrize("sharded", [False, True])
def test_signed_zeros_in_the_partials(sims, tp, sharded):
    # -0 is the mailbox's empty marker: it is sent as +0 and sums as the reference does.
    case = Case(tp, 16 if not sharded else 2 * tp + 1, sharded, seed=5, zeros=0.3)
    case.check(case.run(sims(tp)))


@pytest.mark.parametrize("tp", [2, 3, 8])
def test_collectives(sims, tp):
    sim = sims(tp) if tp != 3 else group(3)
    g = torch.Generator(device="cuda").manual_seed(tp)
    for op, xs, keep, want in symm_collective_cases(tp, H, 20 * tp + 3, g, device="cuda"):
        for r, out in enumerate(sim.collective(op, xs, keep)):
            assert_bitwise(f"{op} rows {xs[0].shape[0]} keep {keep} rank {r}", out, want(r))
    no_errors(sim)


def replay_and_check(sim, cases, replays, seed, **kw):
    """Captures one call per case, then replays them alternately on new partials (and now and
    then a new stream), checking every output of every rank after each replay: residual_out,
    post, comb, and layer_input (gathered, for sharded calls)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    for c in cases:  # warm-up outside capture
        c.check(c.run(sim, **kw))
    torch.cuda.synchronize()
    graphs = []
    for c in cases:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = c.run(sim, **kw)
        graphs.append((graph, outs))
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    for k in range(replays):
        c, (graph, outs) = cases[k % len(cases)], graphs[k % len(cases)]
        for p in c.partials:
            p[: c.T].copy_(torch.randn(c.T, c.H, generator=g, device="cuda").to(torch.bfloat16))
        if k % 10 == 0:
            for r, res in enumerate(c.residuals):
                res.copy_(torch.randn(res.shape, generator=g, device="cuda").to(torch.bfloat16))
                res[c.valid(r) :] = 0
        graph.replay()
        gathered = []
        for r, out in enumerate(outs):
            v = c.valid(r)
            want = c.expected(r)
            for got, w in zip(out[:3], want[:3]):
                bad += (bits(got[:v]) != bits(w)).sum()
            if c.sharded:
                gathered.append(want[3])
            else:
                bad += (bits(out[3]) != bits(want[3])).sum()
        if c.sharded:
            for out in outs:
                bad += (bits(out[3]) != bits(torch.cat(gathered))).sum()
    torch.cuda.synchronize()
    assert int(bad) == 0, f"{int(bad)} elements differ bitwise over {replays} replays"


@pytest.mark.parametrize("tp", [2, 8])
def test_graph_replays_replicated(tp):
    sim = group(tp)
    replay_and_check(sim, [Case(tp, 1, False, 1), Case(tp, 7, False, 2)], 60, seed=tp)
    no_errors(sim)


@pytest.mark.parametrize("tp", [2, 8])
def test_graph_replays_sharded(tp):
    sim = group(tp)
    cases = [Case(tp, tp + 1, True, 3), Case(tp, 100, True, 4)]
    replay_and_check(sim, cases, 20, seed=tp)
    no_errors(sim)


def test_two_streams_are_serialised():
    # Two micro-batches on two streams of one group: the workspace orders the calls (an event
    # chain), so they neither mix sums nor time out, without any synchronisation by the caller.
    tp = 4
    sim = group(tp)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    cases = [Case(tp, 5, False, 20 + k) if k % 2 else Case(tp, 9, True, 20 + k) for k in range(8)]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    for k, c in enumerate(cases):
        with torch.cuda.stream(streams[k % 2]):
            outs.append(c.run(sim))
    torch.cuda.synchronize()
    for c, out in zip(cases, outs):
        c.check(out)
    no_errors(sim)


def test_two_groups_on_two_streams_take_turns():
    # Two symm groups of this process on one GPU, their calls alternating on two streams with no
    # synchronisation by the caller: the device's call order (symm::CallOrder) runs them one after
    # the other, so that neither group's spinning blocks fill the GPU while the other's wait for
    # SMs: no timeout, every result right.
    tp = 2
    sims = [group(tp), group(tp)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    cases, outs = [], []
    for k in range(8):
        case = Case(tp, 5, False, 90 + k) if k % 4 < 2 else Case(tp, 33, True, 90 + k)
        with torch.cuda.stream(streams[k % 2]):
            outs.append(case.run(sims[k % 2]))
        cases.append(case)
    torch.cuda.synchronize()
    for c, out in zip(cases, outs):
        c.check(out)
    for sim in sims:
        no_errors(sim)


# ---- the production launch (a world of one) --------------------------------------------------


@pytest.mark.parametrize("T,sharded", [(1, False), (4, False), (16, False), (1, True), (100, True)])
def test_production_launch(T, sharded):
    sim = group(1)
    case = Case(1, T, sharded, seed=40 + T, extra=2)
    case.check(case.run(sim, production=True), cpu_reference=T <= 4)
    no_errors(sim)


def test_production_launch_collectives():
    sim = group(1)
    g = torch.Generator(device="cuda").manual_seed(9)
    for rows in (3, 40):
        x = torch.randn(rows, H, generator=g, device="cuda").to(torch.bfloat16)
        x[:, :8] = -0.0
        (out,) = sim.collective("all_reduce", [x], production=True)
        assert_bitwise(f"all_reduce rows {rows}", out, R.sum_partials([x]))
    (out,) = sim.collective("reduce_scatter", [x], production=True)
    assert_bitwise("reduce_scatter", out, R.sum_partials([x]))
    y = torch.randn(5, 64, generator=g, device="cuda")
    (out,) = sim.collective("all_gather", [y], 4, production=True)
    assert_bitwise("all_gather", out, y[:4])
    no_errors(sim)


def test_production_launch_under_graph_capture():
    # The programmatic dependent launch of the sharded finish, captured: replays stay bitwise.
    sim = group(1)
    cases = [Case(1, 16, False, 50), Case(1, 1, True, 51), Case(1, 300, True, 52)]
    replay_and_check(sim, cases, 30, seed=5, production=True)
    no_errors(sim)


def test_production_launch_refuses_simulated_worlds():
    with pytest.raises(ValueError, match="^production: "):
        Case(2, 1, False, 1).run(group(2), production=True)


# ---- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 8])
@pytest.mark.parametrize("sharded", [False, True])
def test_absent_rank_times_out_then_every_call_is_refused(tp, sharded):
    timeout = 0.05
    sim = group(tp, timeout=timeout)
    case = Case(tp, 4 * tp + 1 if sharded else 16, sharded, seed=60)
    absent = tp - 1
    t = time.monotonic()
    outs = case.run(sim, absent=absent)
    torch.cuda.synchronize()
    first = time.monotonic() - t
    check_absent_rank_named(sim, tp, absent, outs)
    # The rank that was absent now arrives: the workspace is broken, so every rank refuses the
    # call at once, records it (the late rank: kPeerBroken naming the rank that broke it) and
    # returns NaN, never uninitialised memory.
    t = time.monotonic()
    outs = case.run(sim)
    torch.cuda.synchronize()
    again = time.monotonic() - t
    check_refused_after_absent(sim, absent, outs)
    assert first < 10 * timeout + 5 and again < 5, (first, again)


def test_collective_on_a_broken_workspace_is_nan():
    tp = 2
    sim = group(tp, timeout=0.05)
    xs = [torch.ones(40, H, device="cuda", dtype=torch.bfloat16) for _ in range(tp)]
    sim.collective("all_reduce", xs, absent=1)
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        for out in sim.collective(op, xs):
            assert bool(torch.isnan(out.float()).all()), op
    assert sim.errors()[1]["code"] == "peer_broken"
