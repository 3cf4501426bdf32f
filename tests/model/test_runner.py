# SPDX-License-Identifier: Apache-2.0
"""The runner: SP at sp_threshold whatever the compile pass says (the plan itself is checked
exhaustively in test_plan.py), MTP draft steps as forwards of their own; and on one world of six
gloo ranks every engine of tp 2 and 3 x pp 1 and 2: SP on vs off vs tp=1 logits for token counts
below, at and above the threshold, multi-step drafts checked step by step against tp=1, the
pipeline hand-off (the posted stream) bitwise equal to pp=1, padding that never leaks."""

import hashlib

import pytest
import torch

import mhc_sp.distributed as msd
from mhc_sp.engine.config import CompilationConfig, EngineConfig, ParallelConfig, PassConfig
from mhc_sp.engine.runner import (
    ForwardPlan,
    ModelRunner,
    ParallelGroups,
    init_parallel_groups,
    logits_tolerance,
    plan_forward,
)
from mhc_sp.local_world import run_world
from tests.helpers.engines import TINY, engine

# ---- the decision ------------------------------------------------------------------------------


@pytest.mark.parametrize("eager", [False, True])
def test_sp_engages_at_sp_threshold_whatever_the_compile_pass_minimum(eager):
    # The compile pass keeps a larger minimum of its own; the in-forward SP still follows
    # sp_threshold, with or without enforce_eager.
    e = EngineConfig(
        TINY,
        ParallelConfig(2, 1, 16),
        CompilationConfig(PassConfig(sp_min_token_num=32)),
        enforce_eager=eager,
    )
    assert plan_forward(20, e) == ForwardPlan(20, 20, True, None)
    assert plan_forward(17, e) == ForwardPlan(17, 18, True, None)
    assert plan_forward(15, e) == ForwardPlan(15, 15, False, None)


def test_no_sp_unless_parallel_enables_it():
    # The compile pass switched on by hand does not enable the in-forward SP: sp_threshold is None.
    e = EngineConfig(TINY, ParallelConfig(2, 1, None), CompilationConfig(PassConfig(True, 8)))
    for T in (8, 9, 40):
        assert plan_forward(T, e) == ForwardPlan(T, T, False, None)
    # ... nor does the MoE backend rule fire.
    e = EngineConfig(
        TINY,
        ParallelConfig(2, 1, None),
        CompilationConfig(PassConfig(True, 8)),
        moe_backend="capacity",
    )
    assert not plan_forward(9, e).sharded


def test_logits_tolerance_grows_with_depth_and_scale():
    ref = torch.tensor([4.0, -2.0])
    assert logits_tolerance(3, ref) == pytest.approx(0.015 * 2 * 4)
    assert logits_tolerance(15, ref) > logits_tolerance(3, ref)
    assert logits_tolerance(3, torch.tensor([0.1])) == pytest.approx(0.03)


# ---- world of one ------------------------------------------------------------------------------


def test_runner_world_of_one_drafts_and_input_errors():
    try:
        runner = ModelRunner(engine(1, sp=2, spec=3))
        ids = torch.arange(5)
        out = runner.forward(ids, return_final_stream=True)
        assert out.plan == ForwardPlan(5, 5, False, None)  # tp = 1: SP never engages
        assert out.logits.shape == (5, 240) and out.final_stream.shape == (5, 4 * 96)
        assert out.final_stream.dtype == torch.bfloat16
        assert {"embed", "boundary", "attention", "moe", "lm_head", "total"} <= set(out.timings)
        assert runner.forward(ids).final_stream is None  # only when asked

        drafts = runner.propose(out.final_stream, ids.roll(-1), last_token_indices=[1, 4])
        assert [tuple(t.shape) for t in drafts.logits] == [(5, 240), (2, 240), (2, 240)]
        assert [p.num_tokens for p in drafts.plans] == [5, 2, 2]
        assert torch.equal(drafts.tokens[0], ids.roll(-1))
        # Each later step is fed the previous step's greedy choice on the selected rows.
        assert torch.equal(drafts.tokens[1], drafts.logits[0][[1, 4]].argmax(-1))
        assert torch.equal(drafts.tokens[2], drafts.logits[1].argmax(-1))
        assert {"mtp", "total"} <= set(drafts.timings)
        # Step 0 is the MTP on every row; one step alone gives the same logits.
        one = runner.propose(out.final_stream, ids.roll(-1), num_steps=1)
        assert len(one.logits) == 1 and torch.equal(one.logits[0], drafts.logits[0])
        # The stream is fed back: replaying step 1 from another stream changes step 2.
        forced = [None, torch.tensor([7, 7]), torch.tensor([7, 7])]
        a = runner.propose(
            out.final_stream, ids.roll(-1), last_token_indices=[1, 4], draft_tokens=forced
        )
        b = runner.propose(
            torch.zeros_like(out.final_stream),
            ids.roll(-1),
            last_token_indices=[1, 4],
            draft_tokens=forced,
        )
        assert torch.equal(a.tokens[1], forced[1]) and not torch.equal(a.logits[2], b.logits[2])

        with pytest.raises(
            ValueError,
            match=r"input_ids: expected token ids in \[0, 240\), got values in \[-1, 3\]",
        ):
            runner.forward(torch.tensor([-1, 3]))
        with pytest.raises(ValueError, match="input_ids: expected at least one token, got 0"):
            runner.forward(torch.zeros(0, dtype=torch.int64))
        with pytest.raises(ValueError, match="input_ids: expected a 1-D int64 tensor"):
            runner.forward(ids.float())
        with pytest.raises(
            ValueError,
            match=r"final_stream: expected a bfloat16 tensor of "
            r"shape \(4, 384\)",
        ):
            runner.propose(out.final_stream, ids[:4])
        with pytest.raises(
            ValueError,
            match=r"last_token_indices: expected a non-empty 1-D "
            r"list of row indices in \[0, 5\), got \[5\]",
        ):
            runner.propose(out.final_stream, ids, last_token_indices=[5])
        with pytest.raises(ValueError, match="num_steps: expected a positive int"):
            runner.propose(out.final_stream, ids, num_steps=0)
        with pytest.raises(ValueError, match="num_steps: expected a positive int"):
            ModelRunner(engine(1), runner.groups).propose(out.final_stream, ids)
        with pytest.raises(ValueError, match="draft_tokens: expected at least 3 steps"):
            runner.propose(out.final_stream, ids, draft_tokens=forced[:2])
        with pytest.raises(TypeError, match="engine: expected an EngineConfig"):
            ModelRunner(TINY)
        with pytest.raises(
            ValueError,
            match=r"tensor_parallel_size=2 x pipeline_parallel_size=1 needs "
            r"torch.distributed with 2 ranks",
        ):
            init_parallel_groups(ParallelConfig(2))
    finally:
        msd.destroy()


# ---- one world of six gloo ranks: tp 2 and 3 x pp 1 and 2 ---------------------------------------

THRESHOLD = 4
ENGINES = [(2, 1), (3, 1), (2, 2), (3, 2)]
WORLD = 6
SPEC = 2  # draft steps


def token_cases(tp, pp):
    """pp=1: fewer tokens than ranks, below / at / above the threshold, odd counts; pp=2: one
    count below and one above."""
    if pp == 2:
        return [3, 9]
    return sorted({1, tp - 1, THRESHOLD - 1, THRESHOLD, THRESHOLD + 1, 9, 17} - {0})


def draft_rows(T):
    """Rows the later draft steps run on: five of them (at the threshold, so those steps shard
    on their own) for T >= 9, else the last token only (a step too small to shard)."""
    return [2, 4, 5, 6, T - 1] if T >= 9 else [T - 1]


def engine_groups(rank, tp, pp, self_name):
    """This rank's ParallelGroups for an engine on world ranks 0 .. tp*pp-1, laid out as
    init_parallel_groups lays out a whole world (None on the ranks outside). Collective over the
    world: every rank creates every group."""
    import torch.distributed as dist

    from mhc_sp.engine.model import TPContext

    if tp * pp == WORLD:
        return init_parallel_groups(ParallelConfig(tp, pp))
    tp_groups = [dist.new_group([p * tp + r for r in range(tp)]) for p in range(pp)]
    pp_groups = [dist.new_group([p * tp + r for p in range(pp)]) for r in range(tp)]
    if rank >= tp * pp:
        return None
    pp_rank, tp_rank = divmod(rank, tp)
    return ParallelGroups(
        TPContext(tp_rank, tp, msd.init(tp_groups[pp_rank])),
        pp_rank,
        pp,
        pp_groups[tp_rank],
        self_name,
    )


def digest(t):
    return hashlib.sha1(t.contiguous().view(torch.int16).numpy().tobytes()).hexdigest()


def run_engine(rank, groups, tp, pp):
    """Every check of one engine on this rank; returns what the parent compares across ranks."""
    import torch.distributed as dist

    import mhc_sp.engine.runner.model_runner as model_runner
    from mhc_sp.engine.model import RoutingTrace, TPContext
    from mhc_sp.ops import shard_rows

    on = ModelRunner(engine(tp, sp=THRESHOLD, pp=pp, spec=SPEC), groups)
    off = ModelRunner(engine(tp, pp=pp, spec=SPEC), groups)
    one = ParallelGroups(TPContext(0, 1, groups.self_group), self_group=groups.self_group)
    ref = ModelRunner(engine(1, spec=SPEC), one) if on.is_last_stage else None
    sent = []  # the shape of what stage 0 hands over, per forward
    send = model_runner.send_intermediate
    model_runner.send_intermediate = lambda g, it: (
        sent.append(tuple(it.stream.shape)),
        send(g, it),
    )
    results = []
    for T in token_cases(tp, pp):
        tag = f"[tp={tp} pp={pp} rank={rank} T={T}]"
        g = torch.Generator().manual_seed(T)
        ids, nxt = (torch.randint(0, TINY.vocab_size, (T,), generator=g) for _ in range(2))
        rows = draft_rows(T)
        trace = RoutingTrace()
        a = on.forward(ids, return_final_stream=True, routing=trace)
        da = on.propose(a.final_stream, nxt, last_token_indices=rows, routing=trace)
        b = off.forward(ids, return_final_stream=True)
        db = off.propose(b.final_stream, nxt, last_token_indices=rows, draft_tokens=da.tokens)
        padded = -(-T // tp) * tp if T >= THRESHOLD else T
        assert a.plan == ForwardPlan(T, padded, T >= THRESHOLD), tag
        assert not b.plan.sharded and b.plan.padded_tokens == T, tag
        result = {
            "T": T,
            "plan": (a.plan.padded_tokens, a.plan.sharded),
            "drafts": [(p.num_tokens, p.padded_tokens, p.sharded) for p in da.plans],
        }
        # Every stage's MoE choices in model order (layers, then the draft steps) for the replay.
        recorded = [t.cpu() for t in trace.recorded]
        if pp > 1:
            stages = [None] * pp
            dist.all_gather_object(stages, recorded, group=groups.pp_group)
            recorded = [t for stage in stages for t in stage]
        if not on.is_last_stage:
            assert a.logits is None and a.final_stream is None and da.logits == [], tag
            n = shard_rows(a.plan.padded_tokens, tp) if a.plan.sharded else T
            # This T's sends: on's, then off's; on's is the posted stream on this rank's rows.
            assert sent[-2] == (n, 4, 96), tag
            results.append(result)
            continue
        result["logits"] = digest(a.logits)
        result["draft_logits"] = [digest(t) for t in da.logits]
        assert a.logits.shape == (T, TINY.vocab_size), tag
        assert a.final_stream.shape == (T, 4 * 96), tag  # gathered: every row on every rank
        result["final_stream"] = digest(a.final_stream)
        result["draft_tokens"] = [t.tolist() for t in da.tokens]
        # SP changes nothing: with two ranks every reduction sums two values, the same fp32
        # result in either order, so SP on and off are bit-identical; with three, within tolerance.
        pairs = [("logits", a.logits, b.logits), ("final_stream", a.final_stream, b.final_stream)]
        pairs += [(f"draft step {j}", x, y) for j, (x, y) in enumerate(zip(da.logits, db.logits))]
        for name, x, y in pairs:
            if tp == 2:
                assert torch.equal(x, y), f"{tag} SP on vs off {name}"
            else:
                torch.testing.assert_close(
                    x.float(), y.float(), atol=3e-2, rtol=2e-2, msg=lambda m: f"{tag} {name}: {m}"
                )
        # ... and matches tp=1 on the same weights, step by step, with the routing and the
        # drafted tokens replayed from this run.
        replay = RoutingTrace(recorded)
        r = ref.forward(ids, return_final_stream=True, routing=replay)
        dr = ref.propose(
            r.final_stream, nxt, last_token_indices=rows, draft_tokens=da.tokens, routing=replay
        )
        depth = TINY.num_layers
        for name, x, y, layers in [("logits", a.logits, r.logits, depth)] + [
            (f"draft step {j}", x, y, depth + j + 1)
            for j, (x, y) in enumerate(zip(da.logits, dr.logits))
        ]:
            diff, tol = (x - y).abs().max().item(), logits_tolerance(layers, y)
            assert diff <= tol, f"{tag} vs tp=1 {name}: max_abs_diff={diff} > {tol}"
        results.append(result)
    if sent:  # on's hand-offs (every other) carried T rows, or ceil(T/tp) when sharded
        assert [s[0] for s in sent[0::2]] == [3, shard_rows(-(-9 // tp) * tp, tp)]

    if pp == 1:
        check_padding_and_capacity(on, groups, tp)
    if (tp, pp) == (3, 1):
        check_draft_steps_decide_on_their_own_count(groups, ref)
    return results


def check_draft_steps_decide_on_their_own_count(groups, ref):
    """tp=3, sp_threshold=2: a 2-token forward pads to 3 rows and shards; its draft steps
    (2 tokens, fewer than tp) do not, as the engine's draft layer decides; all match tp=1."""
    from mhc_sp.engine.model import RoutingTrace

    runner = ModelRunner(engine(3, sp=2, spec=2), groups)
    g = torch.Generator().manual_seed(2)
    ids, nxt = (torch.randint(0, TINY.vocab_size, (2,), generator=g) for _ in range(2))
    trace = RoutingTrace()
    out = runner.forward(ids, return_final_stream=True, routing=trace)
    drafts = runner.propose(out.final_stream, nxt, routing=trace)
    assert out.plan == ForwardPlan(2, 3, True)
    assert drafts.plans == [ForwardPlan(2, 2, False)] * 2
    replay = RoutingTrace(trace.recorded)
    r = ref.forward(ids, return_final_stream=True, routing=replay)
    dr = ref.propose(r.final_stream, nxt, draft_tokens=drafts.tokens, routing=replay)
    for j, (x, y) in enumerate([(out.logits, r.logits), *zip(drafts.logits, dr.logits)]):
        tol = logits_tolerance(TINY.num_layers + j, y)
        assert (x - y).abs().max().item() <= tol, f"step {j}"


def check_padding_and_capacity(on, groups, tp):
    from mhc_sp.engine.model import DeepseekV4Model, RoutingTrace, TPContext

    # Padding tokens never reach real tokens: other pad contents, same real rows, bit for bit,
    # in the main forward and in a draft step.
    T, P = 9, 12  # 12 rows: a multiple of every test TP size
    g = torch.Generator().manual_seed(99)
    ids, nxt = (torch.randint(0, TINY.vocab_size, (T,), generator=g) for _ in range(2))
    outs = []
    for fill in (0, 7, 239):
        pad_ids = torch.cat([ids, torch.full((P - T,), fill)])
        with torch.no_grad():
            o = on.model(pad_ids, sharded=True, return_final_stream=True)
            pad_nxt = torch.cat([nxt, torch.full((P - T,), (fill * 3) % 240)])
            d = on.model.mtp_forward(o.final_stream, pad_nxt, sharded=True)
        outs.append((o.logits[:T], d.logits[:T], o.logits[T:]))
    for o in outs[1:]:
        assert torch.equal(o[0], outs[0][0]) and torch.equal(o[1], outs[0][1]), "padding leaked"
    assert not torch.equal(outs[1][2], outs[0][2])  # the padding rows themselves did change

    # Capacity backend without SP: tp matches tp=1 too (routing replayed).
    cap = ModelRunner(engine(tp, backend="capacity"), groups)
    ref_cap = DeepseekV4Model(TINY, tp=TPContext(0, 1, groups.self_group), moe_backend="capacity")
    ids = torch.randint(0, TINY.vocab_size, (11,), generator=g)
    trace = RoutingTrace()
    c = cap.forward(ids, routing=trace)
    with torch.no_grad():
        rc = ref_cap(ids, sharded=False, routing=RoutingTrace(trace.recorded))
    assert (c.logits - rc.logits).abs().max().item() <= logits_tolerance(TINY.num_layers, rc.logits)


def world_worker(rank, world):
    import torch.distributed as dist

    selves = [dist.new_group([r]) for r in range(world)]
    self_name = msd.init(selves[rank])
    results = {}
    for tp, pp in ENGINES:
        groups = engine_groups(rank, tp, pp, self_name)
        if groups is not None:
            assert (groups.pp_rank, groups.tp.rank) == divmod(rank, tp)
            results[(tp, pp)] = run_engine(rank, groups, tp, pp)
        dist.barrier()
    return results


@pytest.fixture(scope="module")
def world():
    return run_world(WORLD, world_worker, timeout=300, start="forkserver")


@pytest.mark.distributed
@pytest.mark.parametrize("tp,pp", ENGINES)
def test_engine_on_six_ranks(world, tp, pp):
    ranks = [r for r in range(tp * pp)]
    per_rank = [world[r][(tp, pp)] for r in ranks]
    assert all((tp, pp) not in world[r] for r in range(tp * pp, WORLD))
    # Every rank and every stage took the same SP decisions for the main forward.
    plans = [[(x["T"], x["plan"]) for x in rank] for rank in per_rank]
    assert all(p == plans[0] for p in plans)
    cases = token_cases(tp, pp)
    assert plans[0] == [
        (T, ((-(-T // tp) * tp, True) if T >= THRESHOLD else (T, False))) for T in cases
    ]
    # The last stage's TP ranks hold the same gathered final stream, drafted the same tokens and
    # planned every draft step on its own: step 0 on all T rows, later steps on the selected rows.
    last = per_rank[(pp - 1) * tp :]
    for key in ("final_stream", "draft_tokens", "drafts"):
        assert all([x[key] for x in rank] == [x[key] for x in last[0]] for rank in last), key
    for x in last[0]:
        T, n = x["T"], len(draft_rows(x["T"]))
        # A draft step decides on its own count (at least the threshold and at least tp).
        step0 = (T, -(-T // tp) * tp, True) if T >= max(THRESHOLD, tp) else (T, T, False)
        later = (n, -(-n // tp) * tp, True) if n >= max(THRESHOLD, tp) else (n, n, False)
        assert x["drafts"] == [step0] + [later] * (SPEC - 1)
    # Both kinds of draft decision occur: a sharded main forward with replicated later steps.
    assert any(x["plan"][1] and not x["drafts"][1][2] for x in last[0]) or pp == 2


@pytest.mark.distributed
@pytest.mark.parametrize("tp", [2, 3])
def test_two_stages_are_bitwise_one_stage(world, tp):
    # The stage boundary (reduce, post | pre, gather) computes what the pp=1 boundary computes,
    # bit for bit, so the last stage's logits and drafts equal the one-stage engine's.
    one = {x["T"]: x for x in world[0][(tp, 1)]}
    for x in world[tp][(tp, 2)]:  # TP rank 0 of the last stage
        assert x["logits"] == one[x["T"]]["logits"], x["T"]
        assert x["draft_logits"] == one[x["T"]]["draft_logits"], x["T"]
