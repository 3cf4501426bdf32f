# SPDX-License-Identifier: Apache-2.0
"""The V4-style model in one process: TP slicing of the weights, the safetensors loader, MoE
backends and their SP rule, the row-parallel linear's reduction, the MTP layer as a forward of its
own. (Multi-rank runs are in test_runner.py.)"""

import pytest
import torch
from safetensors.torch import save_file

import mhc_sp.distributed as msd
from mhc_sp.engine.config import ModelConfig
from mhc_sp.engine.model import (
    DeepseekV4Model,
    IntermediateTensors,
    MoE,
    RoutingTrace,
    RowParallelLinear,
    TPContext,
    init_synthetic,
    load_safetensors,
    pp_layer_range,
    synthetic_state_dict,
)
from mhc_sp.engine.model.parallel import shard_index

TINY = ModelConfig.tiny()


@pytest.fixture
def world_of_one():
    name = msd.init()
    yield name
    msd.destroy()


def ids_for(T, seed, vocab=TINY.vocab_size):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (T,), generator=g), torch.randint(0, vocab, (T,), generator=g)


# ---- weights: synthetic, sliced, loaded ------------------------------------------------------


def test_any_tp_slice_is_a_slice_of_the_tp1_weights():
    full = dict(DeepseekV4Model(TINY).named_parameters())
    for tp in (2, 3):
        for rank in range(tp):
            part = DeepseekV4Model(TINY, tp=TPContext(rank, tp, "unused"))
            names = dict(part.named_parameters())
            assert names.keys() == full.keys()
            for name, p in names.items():
                expected = full[name][shard_index(p.full_shape, p.shard_dim, rank, tp)]
                assert torch.equal(p, expected), f"tp={tp} rank={rank} {name}"
    # Sharded on the intermediate dim (experts), heads (attention), vocab (embedding / LM head).
    p = dict(DeepseekV4Model(TINY, tp=TPContext(1, 4, "x")).named_parameters())
    assert p["layers.0.moe.w_gate"].shape == (8, 12, 96) and p["layers.0.moe.w_down"].shape == (
        8,
        96,
        12,
    )
    assert p["layers.0.attn.wq.weight"].shape == (24, 96) and p[
        "layers.0.attn.wo.weight"
    ].shape == (96, 24)
    assert p["embed.weight"].shape == (60, 96) and p["lm_head.weight"].shape == (60, 96)
    assert p["layers.0.attn_hc.fn"].shape == (24, 384)  # mHC parameters are replicated


def test_pipeline_stages_hold_their_layers_with_the_same_weights():
    cfg = ModelConfig.tiny(num_layers=5)
    assert [list(pp_layer_range(5, r, 2)) for r in range(2)] == [[0, 1, 2], [3, 4]]
    assert [list(pp_layer_range(43, r, 4)) for r in range(4)][3] == list(range(33, 43))
    with pytest.raises(ValueError, match="num_layers=2 must be >= pipeline_parallel_size=3"):
        pp_layer_range(2, 0, 3)
    full = dict(DeepseekV4Model(cfg).named_parameters())
    first = DeepseekV4Model(cfg, pp_rank=0, pp_size=2)
    last = DeepseekV4Model(cfg, pp_rank=1, pp_size=2)
    assert list(first.layers) == ["0", "1", "2"] and list(last.layers) == ["3", "4"]
    assert first.mtp is None and last.mtp is not None and last.embed is not None  # MTP re-uses it
    for stage in (first, last):
        for name, p in stage.named_parameters():
            assert torch.equal(p, full[name]), name


def test_seed_changes_the_weights():
    a = dict(DeepseekV4Model(TINY, seed=1).named_parameters())
    b = dict(DeepseekV4Model(TINY, seed=2).named_parameters())
    assert not torch.equal(a["layers.1.moe.w_up"], b["layers.1.moe.w_up"])
    assert torch.equal(
        a["layers.1.moe.w_up"],
        dict(DeepseekV4Model(TINY, seed=1).named_parameters())["layers.1.moe.w_up"],
    )


def test_v4_flash_builds_on_meta_without_weights():
    cfg = ModelConfig.v4_flash()
    model = DeepseekV4Model(
        cfg, tp=TPContext(3, 8, "x"), pp_rank=3, pp_size=4, sequence_parallel=True, device="meta"
    )
    p = dict(model.named_parameters())
    assert all(t.is_meta for t in p.values())
    assert list(model.layers) == [str(i) for i in range(33, 43)] and model.mtp is not None
    assert p["layers.40.moe.w_gate"].shape == (256, 256, 4096)
    assert p["layers.40.moe.w_gate"].full_shape == (256, 2048, 4096)
    assert p["layers.40.attn.wq.weight"].shape == (512, 4096)
    assert p["layers.40.attn_hc.fn"].shape == (24, 4 * 4096)
    assert p["lm_head.weight"].shape == (129280 // 8, 4096)


def test_safetensors_loader_maps_by_name_and_reports(tmp_path):
    full_model = DeepseekV4Model(TINY)
    tensors = synthetic_state_dict(full_model, seed=7)  # full-size tensors, another seed
    dropped = "layers.1.moe.w_down"
    del tensors[dropped]
    tensors["rotary.inv_freq"] = torch.ones(4)
    path = tmp_path / "model.safetensors"
    save_file({f"model.{k}": v.contiguous() for k, v in tensors.items()}, str(path))

    part = DeepseekV4Model(TINY, tp=TPContext(1, 2, "x"))  # seed 0
    before = part.layers["1"].moe.w_down.clone()
    report = load_safetensors(part, path, name_map=lambda n: n.removeprefix("model."))
    assert report.missing == [dropped]
    assert report.unexpected == ["model.rotary.inv_freq"]
    assert not report.ok and len(report.loaded) == len(tensors) - 1
    for name, p in part.named_parameters():
        if name == dropped:
            assert torch.equal(p, before)  # missing: keeps its value
        else:
            assert torch.equal(p, tensors[name][shard_index(p.full_shape, p.shard_dim, 1, 2)]), name
    # A loaded tp=2 slice is the synthetic seed-7 slice, so loading == generating with that seed.
    assert torch.equal(
        part.layers["0"].moe.w_gate,
        DeepseekV4Model(TINY, tp=TPContext(1, 2, "x"), seed=7).layers["0"].moe.w_gate,
    )

    with pytest.raises(
        ValueError,
        match=r"missing \['layers.1.moe.w_down'\], unexpected \['model.rotary.inv_freq'\]",
    ):
        load_safetensors(part, path, name_map=lambda n: n.removeprefix("model."), strict=True)
    # Without the name map nothing matches.
    report = load_safetensors(DeepseekV4Model(TINY), path)
    assert report.loaded == [] and len(report.unexpected) == len(tensors)
    bad = tmp_path / "bad.safetensors"
    save_file({"embed.weight": torch.zeros(10, 96, dtype=torch.bfloat16)}, str(bad))
    with pytest.raises(
        ValueError, match=r"embed.weight: checkpoint shape \(10, 96\) does not match .* \(240, 96\)"
    ):
        load_safetensors(part, bad)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_safetensors(part, tmp_path / "nope.safetensors")
    with pytest.raises(TypeError, match="name_map: expected a mapping, a callable or None"):
        load_safetensors(part, path, name_map=3)
    # A dict name map works too.
    one = tmp_path / "one.safetensors"
    save_file({"tok_embeddings": tensors["embed.weight"]}, str(one))
    report = load_safetensors(part, one, name_map={"tok_embeddings": "embed.weight"})
    assert report.loaded == ["embed.weight"] and report.unexpected == []
    assert torch.equal(part.embed.weight, tensors["embed.weight"][120:])


# ---- MoE ---------------------------------------------------------------------------------------


def make_moe(backend, sp=False, **changes):
    moe = MoE(ModelConfig.tiny(**changes), TPContext(), "cpu", backend, sequence_parallel=sp)
    init_synthetic(moe, 5)
    return moe


def test_moe_dense_and_eager_agree_and_capacity_drops_in_token_order():
    x = torch.randn(13, 96).to(torch.bfloat16)
    for backend in ("naive", "capacity"):
        moe = make_moe(backend, capacity_factor=0.5)
        assert torch.equal(moe(x), moe(x, dense=True)), backend
    naive, capacity = (
        make_moe("naive", capacity_factor=0.5),
        make_moe("capacity", capacity_factor=0.5),
    )
    ids, weights = naive.route(x)
    assert ids.shape == (13, 2) and torch.allclose(weights.sum(-1), torch.ones(13))
    cap = capacity._capacity(13)  # ceil(0.5 * 13 * 2 / 8) = 2 tokens per expert
    assert cap == 2
    kept = capacity.combine_weights(ids, weights, 13)
    for e in range(8):
        routed = (ids == e).any(-1).nonzero().flatten()
        assert torch.equal((kept[:, e] > 0).nonzero().flatten(), routed[:cap])
    # Early tokens keep all their experts, so their outputs agree; later ones differ.
    assert torch.equal(naive(x)[0], capacity(x)[0])
    assert not torch.equal(naive(x), capacity(x))


def test_moe_backend_not_valid_with_sp_raises():
    with pytest.raises(
        NotImplementedError, match="moe_backend='capacity' does not support sequence parallelism"
    ):
        make_moe("capacity", sp=True)
    moe = make_moe("capacity")
    with pytest.raises(NotImplementedError, match="not valid on a token shard"):
        moe(torch.zeros(4, 96, dtype=torch.bfloat16), sharded=True)
    assert make_moe("naive", sp=True)(
        torch.zeros(4, 96, dtype=torch.bfloat16), sharded=True
    ).shape == (4, 96)
    with pytest.raises(ValueError, match="moe_backend: unknown backend 'fast'"):
        make_moe("fast")
    with pytest.raises(NotImplementedError, match="does not support sequence parallelism"):
        DeepseekV4Model(TINY, moe_backend="capacity", sequence_parallel=True, device="meta")


def test_row_parallel_linear_reduces_only_when_asked(world_of_one):
    # A world of one: the all-reduce is the identity, so the check is that it runs through the
    # group's all_reduce op exactly when reduce_results is set.
    import mhc_sp.engine.model.linear as linear

    calls = []
    real = linear.ops.all_reduce
    linear.ops.all_reduce = lambda x, group: (calls.append(group), real(x, group))[1]
    try:
        x = torch.randn(5, 24).to(torch.bfloat16)
        reducing = RowParallelLinear(24, 16, TPContext(0, 1, world_of_one), "cpu")
        partial = RowParallelLinear(
            24, 16, TPContext(0, 1, world_of_one), "cpu", reduce_results=False
        )
        init_synthetic(reducing, 3)
        init_synthetic(partial, 3)
        assert reducing.reduce_results and not partial.reduce_results
        y, p = reducing(x), partial(x)
        assert calls == [world_of_one] and torch.equal(y, p)
        assert torch.equal(p, torch.nn.functional.linear(x, partial.weight))
    finally:
        linear.ops.all_reduce = real
    # The model's row-parallel projections leave the reduction to the fused boundary ops.
    model = DeepseekV4Model(TINY, device="meta")
    rows = [m for m in model.modules() if isinstance(m, RowParallelLinear)]
    assert len(rows) == 2 * (TINY.num_layers + 1) and not any(m.reduce_results for m in rows)


def test_routing_trace_records_and_replays():
    moe = make_moe("naive")
    x = torch.randn(6, 96).to(torch.bfloat16)
    trace = RoutingTrace()
    out = moe(x, routing=trace)
    assert len(trace.recorded) == 1 and torch.equal(trace.recorded[0], moe.route(x)[0])
    assert torch.equal(moe(x, routing=RoutingTrace(trace.recorded)), out)
    forced = [torch.tensor([[0, 1]] * 8)]  # more rows than tokens: a padded run's choice
    replayed = RoutingTrace(forced)
    moe(x, routing=replayed)
    assert torch.equal(replayed.recorded[0], forced[0][:6])
    with pytest.raises(ValueError, match="replay: has 1 MoE calls, the forward makes more"):
        moe(x, routing=replayed)


# ---- world of one: the model end to end ------------------------------------------------------


def test_world_of_one_forward_mtp_and_validation(world_of_one):
    model = DeepseekV4Model(TINY)
    ids, nxt = ids_for(7, 1)
    out = model(ids, sharded=False, return_final_stream=True)
    assert out.logits.shape == (7, 240) and out.logits.dtype == torch.float32
    assert out.final_stream.shape == (7, 4 * 96) and out.final_stream.dtype == torch.bfloat16
    assert model(ids, sharded=False).final_stream is None  # only when asked
    # The MTP is a forward of its own on the gathered stream; it returns its own stream.
    draft = model.mtp_forward(out.final_stream, nxt, sharded=False)
    assert draft.logits.shape == (7, 240) and draft.final_stream.shape == (7, 4 * 96)
    assert torch.isfinite(out.logits).all() and torch.isfinite(draft.logits).all()
    assert not torch.equal(draft.final_stream, out.final_stream)
    # Sharded on a world of one is the same computation (in a model built for SP).
    sp_model = DeepseekV4Model(TINY, sequence_parallel=True)
    sh = sp_model(ids, sharded=True, return_final_stream=True)
    assert torch.equal(sh.logits, out.logits) and torch.equal(sh.final_stream, out.final_stream)
    sh_draft = sp_model.mtp_forward(out.final_stream, nxt, sharded=True)
    assert torch.equal(sh_draft.logits, draft.logits)
    # The model gates SP itself: a sharded forward in a model built without it is refused.
    message = "sharded: True needs sequence parallelism enabled for this model"
    with pytest.raises(ValueError, match=message):
        model(ids, sharded=True)
    with pytest.raises(ValueError, match=message):
        model.mtp_forward(out.final_stream, nxt, sharded=True)
    # The MTP sees the next tokens and the stream: change either, other draft logits.
    other_ids = model.mtp_forward(out.final_stream, (nxt + 1) % 240, sharded=False)
    assert not torch.equal(other_ids.logits, draft.logits)
    assert not torch.equal(
        model.mtp_forward(draft.final_stream, nxt, sharded=False).logits, draft.logits
    )
    # Causal attention: the first rows' drafts do not depend on the rows after them. The later
    # rows change and the shapes stay (torch's own CPU GEMMs need not give a row the same bits
    # at another row count, which is not what is tested here).
    later = out.final_stream.clone()
    later[4:] = draft.final_stream[4:]
    part = model.mtp_forward(later, torch.cat([nxt[:4], (nxt[4:] + 7) % 240]), sharded=False)
    assert torch.equal(part.logits[:4], draft.logits[:4])
    assert not torch.equal(part.logits[4:], draft.logits[4:])
    no_mtp = DeepseekV4Model(ModelConfig.tiny(num_mtp_layers=0))
    with pytest.raises(ValueError, match="mtp_forward: pipeline stage 0 of 1 has no MTP layer"):
        no_mtp.mtp_forward(out.final_stream, nxt, sharded=False)
    with pytest.raises(ValueError, match=r"stream: expected a bfloat16 tensor of shape \(7, 384\)"):
        model.mtp_forward(out.final_stream[:, :96], nxt, sharded=False)
    with pytest.raises(ValueError, match="next_ids: expected a non-empty 1-D int64 tensor"):
        model.mtp_forward(out.final_stream, nxt.float(), sharded=False)

    with pytest.raises(
        ValueError, match=r"input_ids: expected token ids in \[0, 240\), got values in \[0, 240\]"
    ):
        model(torch.tensor([0, 240]), sharded=False)
    with pytest.raises(ValueError, match="input_ids: expected a 1-D int64 tensor"):
        model(ids.to(torch.int32), sharded=False)
    with pytest.raises(ValueError, match="input_ids: expected at least one token, got 0"):
        model(ids[:0], sharded=False)
    second = DeepseekV4Model(TINY, pp_rank=1, pp_size=2)
    with pytest.raises(
        ValueError, match="intermediate: pipeline stage 1 needs the previous stage's"
    ):
        second(ids, sharded=False)
    with pytest.raises(
        ValueError, match=r"intermediate.stream: expected torch.bfloat16 \(7, 4, 96\)"
    ):
        second(
            ids,
            sharded=False,
            intermediate=IntermediateTensors(torch.zeros(6, 4, 96, dtype=torch.bfloat16)),
        )
    with pytest.raises(ValueError, match=r"intermediate.stream: expected torch.bfloat16"):
        second(
            ids,
            sharded=False,
            intermediate=IntermediateTensors(torch.zeros(7, 4, 96, dtype=torch.float32)),
        )


def test_two_stages_in_one_process_are_bitwise_the_one_stage_model(world_of_one):
    # tp = 1, pp = 2 against tp = 1, pp = 1: the first stage hands the posted stream to the
    # second in this process. Logits, final stream and drafts are bitwise the one-stage model's
    # (mhc_post then mhc_pre computes what mhc_post_pre computes).
    cfg = ModelConfig.tiny(num_layers=3)
    whole = DeepseekV4Model(cfg)
    first = DeepseekV4Model(cfg, pp_rank=0, pp_size=2)
    last = DeepseekV4Model(cfg, pp_rank=1, pp_size=2)
    for T in (1, 5, 16):
        ids, nxt = ids_for(T, T)
        ref = whole(ids, sharded=False, return_final_stream=True)
        it = first(ids, sharded=False).intermediate
        assert it.stream.shape == (T, 4, 96) and it.stream.dtype == torch.bfloat16
        out = last(ids, sharded=False, intermediate=it, return_final_stream=True)
        assert torch.equal(out.logits, ref.logits), T
        assert torch.equal(out.final_stream, ref.final_stream), T
        d_ref = whole.mtp_forward(ref.final_stream, nxt, sharded=False)
        d = last.mtp_forward(out.final_stream, nxt, sharded=False)
        assert torch.equal(d.logits, d_ref.logits), T
