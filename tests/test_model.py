"""The V4-style model (issue 4 §2, §5): TP slicing, weights, MoE backends, the MTP layer, and on
gloo worlds of 2 and 3 ranks: SP on vs SP off vs tp=1 logits for token counts below, at and above
the threshold, odd counts, fewer tokens than ranks; padding never leaks."""

import pytest
import torch
from safetensors.torch import save_file

import mhc_sp.distributed as msd
from dist_harness import run_world
from mhc_sp.config import EngineConfig, ModelConfig, ParallelConfig
from mhc_sp.model import (DeepseekV4Model, IntermediateTensors, MhcStream, MoE, RoutingTrace,
                          TPContext, init_synthetic, load_safetensors, pp_layer_range,
                          synthetic_state_dict)
from mhc_sp.model.parallel import shard_index
from mhc_sp.runner import ModelRunner, logits_tolerance

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
    assert p["layers.0.moe.w_gate"].shape == (8, 12, 96) and p["layers.0.moe.w_down"].shape == (8, 96, 12)
    assert p["layers.0.attn.wq.weight"].shape == (24, 96) and p["layers.0.attn.wo.weight"].shape == (96, 24)
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
    assert torch.equal(a["layers.1.moe.w_up"], dict(DeepseekV4Model(TINY, seed=1).named_parameters())["layers.1.moe.w_up"])


def test_v4_flash_builds_on_meta_without_weights():
    cfg = ModelConfig.v4_flash()
    model = DeepseekV4Model(cfg, tp=TPContext(3, 8, "x"), pp_rank=3, pp_size=4,
                            sequence_parallel=True, device="meta")
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
    assert torch.equal(part.layers["0"].moe.w_gate, DeepseekV4Model(TINY, tp=TPContext(1, 2, "x"), seed=7).layers["0"].moe.w_gate)

    with pytest.raises(ValueError, match=r"missing \['layers.1.moe.w_down'\], unexpected \['model.rotary.inv_freq'\]"):
        load_safetensors(part, path, name_map=lambda n: n.removeprefix("model."), strict=True)
    # Without the name map nothing matches.
    report = load_safetensors(DeepseekV4Model(TINY), path)
    assert report.loaded == [] and len(report.unexpected) == len(tensors)
    bad = tmp_path / "bad.safetensors"
    save_file({"embed.weight": torch.zeros(10, 96, dtype=torch.bfloat16)}, str(bad))
    with pytest.raises(ValueError, match=r"embed.weight: checkpoint shape \(10, 96\) does not match .* \(240, 96\)"):
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
    naive, capacity = make_moe("naive", capacity_factor=0.5), make_moe("capacity", capacity_factor=0.5)
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


def test_moe_backend_that_cannot_shard_raises_with_sp():
    with pytest.raises(NotImplementedError, match="moe_backend='capacity' cannot run on a token shard"):
        make_moe("capacity", sp=True)
    moe = make_moe("capacity")
    with pytest.raises(NotImplementedError, match="cannot run on a token shard"):
        moe(torch.zeros(4, 96, dtype=torch.bfloat16), sharded=True)
    assert make_moe("naive", sp=True)(torch.zeros(4, 96, dtype=torch.bfloat16), sharded=True).shape == (4, 96)
    with pytest.raises(ValueError, match="backend: unknown MoE backend 'fast'"):
        make_moe("fast")
    with pytest.raises(NotImplementedError, match="cannot run on a token shard"):
        DeepseekV4Model(TINY, moe_backend="capacity", sequence_parallel=True, device="meta")


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
    out = model(ids, sharded=False, mtp_input_ids=nxt)
    assert out.logits.shape == (7, 240) and out.logits.dtype == torch.float32
    assert out.mtp_logits.shape == (7, 240) and out.final_stream.shape == (7, 4, 96)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.mtp_logits).all()
    # Sharded on a world of one is the same computation.
    sh = model(ids, sharded=True, mtp_input_ids=nxt)
    assert torch.equal(sh.logits, out.logits) and torch.equal(sh.mtp_logits, out.mtp_logits)
    # The MTP sees the next tokens: other next tokens, other draft logits, same main logits.
    other = model(ids, sharded=False, mtp_input_ids=(nxt + 1) % 240)
    assert torch.equal(other.logits, out.logits) and not torch.equal(other.mtp_logits, out.mtp_logits)
    assert model(ids, sharded=False).mtp_logits is None
    no_mtp = DeepseekV4Model(ModelConfig.tiny(num_mtp_layers=0))
    assert no_mtp.mtp is None and no_mtp(ids, sharded=False, mtp_input_ids=nxt).mtp_logits is None

    with pytest.raises(ValueError, match=r"input_ids: expected token ids in \[0, 240\), got values in \[0, 240\]"):
        model(torch.tensor([0, 240]), sharded=False)
    with pytest.raises(ValueError, match="input_ids: expected a 1-D int64 tensor"):
        model(ids.to(torch.int32), sharded=False)
    with pytest.raises(ValueError, match="input_ids: expected at least one token, got 0"):
        model(ids[:0], sharded=False)
    with pytest.raises(ValueError, match=r"mtp_input_ids: expected an int64 tensor of shape \(7,\)"):
        model(ids, sharded=False, mtp_input_ids=nxt[:3])
    second = DeepseekV4Model(TINY, pp_rank=1, pp_size=2)
    with pytest.raises(ValueError, match="intermediate: pipeline stage 1 needs the previous stage's"):
        second(ids, sharded=False)
    bad = IntermediateTensors(torch.zeros(7, 96, dtype=torch.bfloat16),
                              MhcStream(torch.zeros(6, 4, 96, dtype=torch.bfloat16),
                                        torch.zeros(7, 4), torch.zeros(7, 4, 4)))
    with pytest.raises(ValueError, match=r"intermediate.residual: expected torch.bfloat16 \(7, 4, 96\)"):
        second(ids, sharded=False, intermediate=bad)


# ---- gloo worlds: SP on vs off vs tp=1 ---------------------------------------------------------

def token_cases(world, threshold):
    """Fewer tokens than ranks, below / at / above the threshold, odd counts."""
    return sorted({1, world - 1, threshold - 1, threshold, threshold + 1, 9, 17} - {0})


def worker_tp_vs_sp_vs_tp1(rank, world, threshold):
    from mhc_sp.ops import shard_rows
    from mhc_sp.runner import init_parallel_groups

    torch.manual_seed(0)
    groups = init_parallel_groups(ParallelConfig(world))
    ref = DeepseekV4Model(TINY, tp=TPContext(0, 1, groups.self_group))
    on = ModelRunner(EngineConfig(TINY, ParallelConfig(world, 1, threshold)), groups)
    on_eager = ModelRunner(EngineConfig(TINY, ParallelConfig(world, 1, threshold), enforce_eager=True), groups)
    off = ModelRunner(EngineConfig(TINY, ParallelConfig(world)), groups)
    layers = TINY.num_layers + TINY.num_mtp_layers
    checked = []
    for T in token_cases(world, threshold):
        tag = f"[tp={world} rank={rank} T={T} threshold={threshold}]"
        ids, nxt = ids_for(T, seed=T)
        trace = RoutingTrace()
        a = on.forward(ids, nxt, routing=trace)
        b = off.forward(ids, nxt)
        padded = -(-T // world) * world if T >= threshold else T
        assert a.plan.padded_tokens == padded and a.plan.sharded == (T >= threshold), tag
        assert not b.plan.sharded and b.plan.padded_tokens == T, tag
        assert a.logits.shape == b.logits.shape == (T, TINY.vocab_size), tag
        # SP changes nothing: with two ranks every reduction sums two values, in either order the
        # same fp32 result, so SP on and off are bit-identical; with more ranks, within tolerance.
        for name, x, y in (("logits", a.logits, b.logits), ("mtp_logits", a.mtp_logits, b.mtp_logits)):
            if world == 2:
                assert torch.equal(x, y), f"{tag} SP on vs off {name}"
            else:
                torch.testing.assert_close(x, y, atol=1e-2, rtol=1e-2, msg=lambda m: f"{tag} {name}: {m}")
        # ... and matches tp=1 on the same weights, routing replayed from the TP run.
        with torch.no_grad():
            r = ref(ids, sharded=False, mtp_input_ids=nxt, routing=RoutingTrace(trace.recorded))
        for name, x, y in (("logits", a.logits, r.logits), ("mtp_logits", a.mtp_logits, r.mtp_logits)):
            diff, tol = (x - y).abs().max().item(), logits_tolerance(layers, y)
            assert diff <= tol, f"{tag} vs tp=1 {name}: max_abs_diff={diff} > {tol}"
        # The eager in-forward path decides and computes the same.
        e = on_eager.forward(ids, nxt)
        assert e.plan == a.plan and torch.equal(e.logits, a.logits), tag

        # The model called directly with sharded=True on an unpadded (odd) count: the ops pad the
        # stream themselves, the final stream is ceil(T/tp) rows and its padding rows stay zero.
        with torch.no_grad():
            d = on.model(ids, sharded=True, mtp_input_ids=nxt)
        rows = shard_rows(T, world)
        assert d.final_stream.shape == (rows, 4, 96), tag
        pad = rows * (rank + 1) - T
        if pad > 0:
            assert torch.count_nonzero(d.final_stream[-min(pad, rows):]) == 0, tag + " stream padding leaked"
        torch.testing.assert_close(d.logits, b.logits, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(d.mtp_logits, b.mtp_logits, atol=1e-2, rtol=1e-2)
        checked.append((T, a.plan.sharded))

    # Padding tokens never reach real tokens: different pad contents, same real rows, bit for bit.
    T, P = 9, 12  # 12 rows: a multiple of every test TP size
    ids, nxt = ids_for(T, seed=99)
    outs = []
    for fill in (0, 7, 239):
        pad_ids = torch.cat([ids, torch.full((P - T,), fill)])
        pad_nxt = torch.cat([nxt, torch.full((P - T,), (fill * 3) % 240)])
        with torch.no_grad():
            o = on.model(pad_ids, sharded=True, mtp_input_ids=pad_nxt)
        outs.append((o.logits[:T], o.mtp_logits[:T], o.logits[T:]))
    for o in outs[1:]:
        assert torch.equal(o[0], outs[0][0]) and torch.equal(o[1], outs[0][1]), "padding leaked"
    assert not torch.equal(outs[1][2], outs[0][2])  # the padding rows themselves did change

    # Capacity backend without SP: tp matches tp=1 too (routing replayed).
    cap = ModelRunner(EngineConfig(TINY, ParallelConfig(world), moe_backend="capacity"), groups)
    ref_cap = DeepseekV4Model(TINY, tp=TPContext(0, 1, groups.self_group), moe_backend="capacity")
    ids, nxt = ids_for(11, seed=3)
    trace = RoutingTrace()
    c = cap.forward(ids, nxt, routing=trace)
    with torch.no_grad():
        rc = ref_cap(ids, sharded=False, mtp_input_ids=nxt, routing=RoutingTrace(trace.recorded))
    assert (c.logits - rc.logits).abs().max().item() <= logits_tolerance(layers, rc.logits)
    return checked


@pytest.mark.parametrize("world,threshold", [(2, 4), (3, 5)])
def test_sp_on_vs_off_vs_tp1(world, threshold):
    results = run_world(world, worker_tp_vs_sp_vs_tp1, threshold)
    expected = [(T, T >= threshold) for T in token_cases(world, threshold)]
    assert results == [expected] * world
    assert any(s for _, s in expected) and any(not s for _, s in expected)
