"""The runner (issue 4 §3): padding, the one SP decision, plans with CUDA graph sizes, and on four
gloo ranks pipeline stages pp=2 x tp=2 handing token-sharded tensors to each other (plus tp=4)."""

import pytest
import torch

import mhc_sp.distributed as msd
from dist_harness import run_world
from mhc_sp.config import CompilationConfig, EngineConfig, ModelConfig, ParallelConfig
from mhc_sp.runner import (ForwardPlan, ModelRunner, init_parallel_groups, is_sharded,
                           logits_tolerance, plan_forward, sp_padded_tokens)

TINY = ModelConfig.tiny()


def engine(tp, sp=None, max_graph=0, eager=False, pp=1, model=TINY):
    return EngineConfig(model, ParallelConfig(tp, pp, sp),
                        CompilationConfig(max_cudagraph_capture_size=max_graph), enforce_eager=eager)


# ---- the decision ------------------------------------------------------------------------------

def test_is_sharded_rule():
    assert not is_sharded(100, 4, None)  # SP off
    assert not is_sharded(100, 1, 1)  # tp = 1
    assert is_sharded(8, 4, 8) and is_sharded(12, 4, 8)  # at / above the threshold
    assert not is_sharded(7, 4, 8)  # below
    assert not is_sharded(3, 4, 1)  # fewer tokens than ranks
    assert is_sharded(4, 4, 1)


def test_padding_and_decision_for_every_small_case():
    for tp in (1, 2, 3, 4):
        for threshold in (None, 1, 2, 5, 8):
            for T in range(1, 40):
                plan = plan_forward(T, engine(tp, threshold))
                padded = sp_padded_tokens(T, tp, threshold)
                assert plan == ForwardPlan(T, padded, is_sharded(padded, tp, threshold), None)
                sp_on = tp > 1 and threshold is not None
                if sp_on and T >= threshold:
                    assert padded % tp == 0 and 0 <= padded - T < tp and plan.sharded
                else:
                    assert padded == T and not plan.sharded
                # A pure function of the padded count: deciding again from it gives the same.
                assert plan_forward(padded, engine(tp, threshold)).sharded == plan.sharded


def test_plan_eager_and_compiled_paths_agree():
    for T in range(1, 30):
        assert plan_forward(T, engine(4, 6, eager=True)) == plan_forward(T, engine(4, 6))


def test_cuda_graph_plans_never_shard():
    # Only the plan is computed: no CUDA needed. Sizes 1, 2, 4, 8, 16 are captured.
    e = engine(2, sp=17, max_graph=16)
    plans = {T: plan_forward(T, e, "cuda") for T in range(1, 40)}
    assert plans[3] == ForwardPlan(3, 4, False, 4)
    assert plans[9] == ForwardPlan(9, 16, False, 16)
    assert plans[16] == ForwardPlan(16, 16, False, 16)
    assert plans[17] == ForwardPlan(17, 18, True, None)  # eager, SP
    assert all(p.graph_size is None or not p.sharded for p in plans.values())
    assert plan_forward(9, e, "cpu").graph_size is None  # graphs only on CUDA
    assert plan_forward(9, engine(2, sp=17, max_graph=16, eager=True), "cuda").graph_size is None
    with pytest.raises(ValueError, match="num_tokens: expected a positive int, got 0"):
        plan_forward(0, e)


def test_logits_tolerance_grows_with_depth_and_scale():
    ref = torch.tensor([4.0, -2.0])
    assert logits_tolerance(3, ref) == pytest.approx(0.015 * 2 * 4)
    assert logits_tolerance(15, ref) > logits_tolerance(3, ref)
    assert logits_tolerance(3, torch.tensor([0.1])) == pytest.approx(0.03)


# ---- world of one ------------------------------------------------------------------------------

def test_runner_world_of_one_and_input_errors():
    try:
        runner = ModelRunner(engine(1, sp=2))
        ids = torch.arange(5)
        out = runner.forward(ids, ids.roll(-1))
        assert out.plan == ForwardPlan(5, 5, False, None)  # tp = 1: SP never engages
        assert out.logits.shape == (5, 240) and out.mtp_logits.shape == (5, 240)
        assert {"embed", "boundary", "attention", "moe", "lm_head", "mtp", "total"} <= set(out.timings)
        with pytest.raises(ValueError, match=r"input_ids: expected token ids in \[0, 240\), got values in \[-1, 3\]"):
            runner.forward(torch.tensor([-1, 3]))
        with pytest.raises(ValueError, match="input_ids: expected at least one token, got 0"):
            runner.forward(torch.zeros(0, dtype=torch.int64))
        with pytest.raises(ValueError, match="mtp_input_ids: expected 5 tokens"):
            runner.forward(ids, ids[:4])
        with pytest.raises(ValueError, match="input_ids: expected a 1-D int64 tensor"):
            runner.forward(ids.float())
        with pytest.raises(TypeError, match="engine: expected an EngineConfig"):
            ModelRunner(TINY)
        with pytest.raises(ValueError, match=r"tensor_parallel_size=2 x pipeline_parallel_size=1 needs "
                                             r"torch.distributed with 2 ranks"):
            init_parallel_groups(ParallelConfig(2))
    finally:
        msd.destroy()


# ---- four gloo ranks: pp=2 x tp=2, and tp=4 ------------------------------------------------------

def worker_pipeline(rank, world):
    import torch.distributed as dist

    from mhc_sp.model import DeepseekV4Model, RoutingTrace, TPContext
    from mhc_sp.ops import shard_rows

    cfg = ModelConfig.tiny(num_layers=3)  # stage 0: layers 0-1, stage 1: layer 2 + MTP
    layers = cfg.num_layers + cfg.num_mtp_layers
    groups = init_parallel_groups(ParallelConfig(2, 2))
    assert (groups.pp_rank, groups.tp.rank) == divmod(rank, 2)
    on = ModelRunner(engine(2, sp=4, pp=2, model=cfg), groups)
    off = ModelRunner(engine(2, pp=2, model=cfg), groups)
    ref = DeepseekV4Model(cfg, tp=TPContext(0, 1, groups.self_group))
    sent = []
    if groups.pp_rank == 0:  # record what stage 0 hands over
        original = on._send
        on._send = lambda it: (sent.append([tuple(t.shape) for t in it.tensors()]), original(it))[1]
    decisions = []
    for T in (1, 3, 4, 7, 9):
        tag = f"[pp=2 tp=2 rank={rank} T={T}]"
        g = torch.Generator().manual_seed(T)
        ids, nxt = (torch.randint(0, cfg.vocab_size, (T,), generator=g) for _ in range(2))
        trace = RoutingTrace()
        a = on.forward(ids, nxt, routing=trace)
        b = off.forward(ids, nxt)
        decisions.append((T, a.plan.padded_tokens, a.plan.sharded))
        # Every stage's MoE choices, in model order, for replaying them in the tp=1 reference.
        stages = [None, None]
        dist.all_gather_object(stages, [t.cpu() for t in trace.recorded], group=groups.pp_group)
        if groups.pp_rank == 0:
            assert a.logits is None and b.logits is None, tag
            rows = shard_rows(a.plan.padded_tokens, 2) if a.plan.sharded else T
            assert sent[-1] == [(rows, 96), (rows, 4, 96), (rows, 4), (rows, 4, 4)], tag
            continue
        assert torch.equal(a.logits, b.logits) and torch.equal(a.mtp_logits, b.mtp_logits), tag + " SP on vs off"
        with torch.no_grad():
            r = ref(ids, sharded=False, mtp_input_ids=nxt,
                    routing=RoutingTrace([t for stage in stages for t in stage]))
        for name, x, y in (("logits", a.logits, r.logits), ("mtp_logits", a.mtp_logits, r.mtp_logits)):
            diff = (x - y).abs().max().item()
            assert diff <= logits_tolerance(layers, y), f"{tag} {name} vs tp=1: {diff}"
    if groups.pp_rank == 0:  # sharded hand-offs carried ceil(T/tp) rows: 1, 2 -> 2, 4 -> 4, 5 rows
        assert [s[0][0] for s in sent] == [1, 3, 2, 4, 5]

    # tp=4 (pp=1) on the same four ranks: fewer tokens than ranks, and an odd count above threshold.
    groups4 = init_parallel_groups(ParallelConfig(4))
    on4 = ModelRunner(engine(4, sp=4), groups4)
    off4 = ModelRunner(engine(4), groups4)
    for T in (3, 9):
        g = torch.Generator().manual_seed(T)
        ids, nxt = (torch.randint(0, TINY.vocab_size, (T,), generator=g) for _ in range(2))
        trace = RoutingTrace()
        a, b = on4.forward(ids, nxt, routing=trace), off4.forward(ids, nxt)
        assert a.plan.sharded == (T >= 4) and a.plan.padded_tokens == (12 if T == 9 else 3)
        torch.testing.assert_close(a.logits, b.logits, atol=1e-2, rtol=1e-2)
        with torch.no_grad():
            r = DeepseekV4Model(TINY, tp=TPContext(0, 1, groups4.self_group))(
                ids, sharded=False, mtp_input_ids=nxt, routing=RoutingTrace(trace.recorded))
        assert (a.logits - r.logits).abs().max().item() <= logits_tolerance(3, r.logits)
        assert (a.mtp_logits - r.mtp_logits).abs().max().item() <= logits_tolerance(3, r.mtp_logits)
        decisions.append((T, a.plan.padded_tokens, a.plan.sharded))
    return decisions


def test_pipeline_pp2_tp2_and_tp4_on_four_ranks():
    results = run_world(4, worker_pipeline)
    # Every rank and every stage took the same decisions.
    assert all(r == results[0] for r in results)
    assert results[0] == [(1, 1, False), (3, 3, False), (4, 4, True), (7, 8, True), (9, 10, True),
                          (3, 3, False), (9, 12, True)]
