# SPDX-License-Identifier: Apache-2.0
"""Every configuration rule (parallel sizes, sp_threshold against CUDA graphs and the compile pass,
the MoE backend rule, the model's shape rules), with the messages."""

import dataclasses

import pytest

from mhc_sp.config import MhcConfig
from mhc_sp.engine.config import (
    MAX_NUM_TOKENS,
    MOE_BACKEND_SUPPORTS_SP,
    CompilationConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    PassConfig,
    sequence_parallelism_threshold,
)

TINY = ModelConfig.tiny()


def engine(
    tp=2, pp=1, sp=None, max_graph=0, eager=False, backend="naive", pass_config=None, model=TINY
):
    comp = CompilationConfig(
        pass_config=pass_config or PassConfig(), max_cudagraph_capture_size=max_graph
    )
    return EngineConfig(
        model, ParallelConfig(tp, pp, sp), comp, enforce_eager=eager, moe_backend=backend
    )


# ---- ParallelConfig ------------------------------------------------------------------------


def test_parallel_defaults_and_properties():
    p = ParallelConfig()
    assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.sp_threshold) == (1, 1, None)
    assert not p.enable_sp and p.sequence_parallel_size == 1
    assert ParallelConfig(4, 1, 8).enable_sp and ParallelConfig(4, 1, 8).sequence_parallel_size == 4
    # Only with tp > 1.
    assert (
        not ParallelConfig(1, 2, 8).enable_sp
        and ParallelConfig(1, 2, 8).sequence_parallel_size == 1
    )
    assert (
        not ParallelConfig(4, 1, None).enable_sp and ParallelConfig(4).sequence_parallel_size == 1
    )
    assert ParallelConfig(2, 3).world_size == 6


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "8"])
def test_sp_threshold_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=f"sp_threshold must be a positive integer, got {bad!r}"):
        ParallelConfig(2, 1, bad)


def test_sp_threshold_has_an_upper_bound():
    assert ParallelConfig(2, 1, MAX_NUM_TOKENS).sp_threshold == 2**31 - 1
    with pytest.raises(
        ValueError, match=r"sp_threshold must be at most 2147483647 \(2\*\*31 - 1, the most tokens"
    ):
        ParallelConfig(2, 1, 2**40)


@pytest.mark.parametrize(
    "field,bad",
    [("tensor_parallel_size", 0), ("pipeline_parallel_size", -1), ("tensor_parallel_size", 1.5)],
)
def test_parallel_sizes_must_be_positive_integers(field, bad):
    with pytest.raises(ValueError, match=f"{field} must be a positive integer, got {bad!r}"):
        ParallelConfig(**{field: bad})


# ---- sp_threshold vs CUDA graphs -----------------------------------------------------------


@pytest.mark.parametrize("sp,max_graph", [(8, 8), (4, 8), (1, 512)])
def test_threshold_at_or_below_capture_size_is_refused_with_tp(sp, max_graph):
    with pytest.raises(
        ValueError,
        match=f"sp_threshold={sp} must be greater than "
        f"max_cudagraph_capture_size={max_graph} with tensor_parallel_size=2",
    ):
        engine(tp=2, sp=sp, max_graph=max_graph)


@pytest.mark.parametrize("sp,max_graph", [(8, 16), (8, 8), (1, 512)])
def test_enforce_eager_captures_nothing_so_any_threshold_is_accepted(sp, max_graph):
    # As in the engine: enforce_eager sets the capture size to 0, so the refusal cannot fire.
    e = engine(tp=2, sp=sp, max_graph=max_graph, eager=True)
    assert e.compilation.max_cudagraph_capture_size == 0
    assert e.compilation.cudagraph_capture_sizes() == [] and not e.use_cudagraphs
    assert e.sp_threshold == sp and e.parallel.enable_sp


def test_threshold_above_capture_size_or_tp1_is_accepted():
    assert engine(tp=2, sp=9, max_graph=8).sp_threshold == 9
    e = engine(tp=1, sp=4, max_graph=8)  # tp = 1: SP is off, nothing to refuse
    assert e.sp_threshold is None and not e.compilation.pass_config.enable_sp


def test_capture_sizes():
    assert CompilationConfig(max_cudagraph_capture_size=0).cudagraph_capture_sizes() == []
    assert CompilationConfig(max_cudagraph_capture_size=3).cudagraph_capture_sizes() == [1, 2, 3]
    assert CompilationConfig(max_cudagraph_capture_size=20).cudagraph_capture_sizes() == [
        1,
        2,
        4,
        8,
        16,
        20,
    ]
    with pytest.raises(
        ValueError, match="max_cudagraph_capture_size must be an integer >= 0, got -1"
    ):
        CompilationConfig(max_cudagraph_capture_size=-1)
    assert engine(tp=2, sp=9, max_graph=8).use_cudagraphs
    assert not engine(tp=2, sp=9, max_graph=8, eager=True).use_cudagraphs
    assert not engine(tp=2, max_graph=0).use_cudagraphs


# ---- mapping sp_threshold into the compile pass --------------------------------------------


def test_threshold_maps_into_pass_config_when_not_eager():
    e = engine(tp=2, sp=16)
    assert e.compilation.pass_config == PassConfig(enable_sp=True, sp_min_token_num=16)
    assert e.sp_threshold == 16


def test_none_defers_to_the_pass_default():
    e = engine(tp=2, sp=None)
    assert e.compilation.pass_config == PassConfig()  # untouched: the pass's default (off)
    assert e.sp_threshold is None


def test_existing_min_token_num_is_kept_but_sp_still_follows_sp_threshold():
    for eager in (False, True):
        e = engine(tp=2, sp=16, pass_config=PassConfig(sp_min_token_num=32), eager=eager)
        # The compile pass keeps its own minimum (and is switched on only when not eager) ...
        switched_on = None if eager else True
        assert e.compilation.pass_config == PassConfig(switched_on, sp_min_token_num=32)
        # ... while the in-forward SP engages at sp_threshold either way.
        assert e.sp_threshold == 16


def test_enforce_eager_maps_nothing_and_uses_the_eager_path():
    e = engine(tp=2, sp=16, eager=True)
    assert e.compilation.pass_config == PassConfig()
    assert e.sp_threshold == 16  # read by the eager in-forward path


def test_explicit_pass_config_rules():
    # The pass switched on by hand, sp_threshold unset: the pass keeps its own minimum (at or
    # below the capture size too, as the engine accepts it), but the in-forward SP stays off
    # because parallel.enable_sp is False.
    for minimum in (12, 8, 1):
        e = engine(
            tp=2, pass_config=PassConfig(enable_sp=True, sp_min_token_num=minimum), max_graph=8
        )
        assert e.compilation.pass_config == PassConfig(True, minimum) and e.sp_threshold is None
    with pytest.raises(ValueError, match="sp_min_token_num must be a positive integer, got 0"):
        PassConfig(sp_min_token_num=0)
    with pytest.raises(ValueError, match="enable_sp must be None, True or False, got 1"):
        PassConfig(enable_sp=1)
    # The threshold sets a min even when the user switched the pass on without one.
    e = engine(tp=2, sp=5, pass_config=PassConfig(enable_sp=True))
    assert e.compilation.pass_config.sp_min_token_num == 5 and e.sp_threshold == 5


def test_pass_without_a_minimum_takes_the_engines_default_or_switches_off(monkeypatch):
    import mhc_sp.engine.config.engine as engine_module

    # No CUDA device (or a hidden size below the engine's minimum): no default exists, so the
    # pass is switched off with the engine's warning, never an error.
    monkeypatch.setattr(engine_module, "cuda_device_capability", lambda: None)
    with pytest.warns(UserWarning, match="Model hidden_size too small for the SP threshold"):
        e = engine(tp=2, pass_config=PassConfig(enable_sp=True))
    assert e.compilation.pass_config == PassConfig(False, None)
    # On a Hopper GPU with hidden 8192 the default is 8 MiB per GPU of bf16 rows: 512 * tp.
    monkeypatch.setattr(engine_module, "cuda_device_capability", lambda: 90)
    wide = ModelConfig.tiny(hidden_size=8192, num_heads=64)
    e = engine(tp=4, pass_config=PassConfig(enable_sp=True), model=wide)
    assert e.compilation.pass_config == PassConfig(True, 2048)
    with pytest.warns(UserWarning, match="hidden_size too small"):  # 96 < 8192
        assert not engine(
            tp=4, pass_config=PassConfig(enable_sp=True)
        ).compilation.pass_config.enable_sp
    # tp = 1: the engine switches the pass off with a warning.
    with pytest.warns(UserWarning, match="Sequence Parallelism requires TP>1, disabling"):
        e = engine(tp=1, pass_config=PassConfig(enable_sp=True, sp_min_token_num=8))
    assert e.compilation.pass_config == PassConfig(False, 8)


@pytest.mark.parametrize(
    "hidden,tp,capability,expected",
    [
        (8192, 2, 90, 1024),  # 8 MiB * 2 // (8192 * 2 bytes)
        (8192, 8, 90, 4096),
        (7168, 8, 90, None),  # V4-Pro's hidden size is below the minimum
        (4096, 4, 90, None),  # V4-Flash's too
        (8192, 2, 100, 4096),  # Blackwell: 32 MiB per GPU
        (8192, 2, 103, 4096),  # every Blackwell variant counts as 100
        (16384, 4, 100, 4096),
        (8192, 2, 80, None),  # no table for Ampere
        (8192, 2, 120, None),
        (8192, 2, None, None),  # not CUDA
    ],
)
def test_engines_default_minimum(hidden, tp, capability, expected):
    assert sequence_parallelism_threshold(hidden, tp, 2, capability) == expected


# ---- MoE backend ---------------------------------------------------------------------------


def test_moe_backend_not_valid_on_a_token_shard_is_refused_when_sp_is_enabled():
    assert MOE_BACKEND_SUPPORTS_SP == {"naive": True, "capacity": False}
    with pytest.raises(
        NotImplementedError,
        match="moe_backend='capacity' does not support sequence parallelism: which tokens it drops",
    ):
        engine(tp=2, sp=4, backend="capacity")
    with pytest.raises(NotImplementedError, match="not valid on a token shard"):
        engine(tp=2, sp=4, backend="capacity", eager=True)
    # Without SP enabled (no threshold, or tp = 1) it is fine, even with the compile pass switched
    # on by hand: SP is enabled by parallel.enable_sp alone.
    assert engine(tp=2, sp=None, backend="capacity").moe_backend == "capacity"
    assert engine(tp=1, sp=4, backend="capacity").moe_backend == "capacity"
    by_hand = PassConfig(enable_sp=True, sp_min_token_num=8)
    assert engine(tp=2, backend="capacity", pass_config=by_hand).moe_backend == "capacity"
    with pytest.raises(ValueError, match="moe_backend: unknown backend 'fast'"):
        engine(tp=2, backend="fast")


# ---- shapes that must split over TP / PP ---------------------------------------------------


@pytest.mark.parametrize(
    "field,value,tp",
    [("num_heads", 12, 5), ("vocab_size", 241, 2), ("moe_intermediate_size", 50, 4)],
)
def test_dims_must_split_over_tp(field, value, tp):
    model = dataclasses.replace(TINY, **{field: value})
    with pytest.raises(
        ValueError, match=f"model.{field}={value} must be divisible by tensor_parallel_size={tp}"
    ):
        engine(tp=tp, model=model)


def test_every_stage_needs_a_layer():
    with pytest.raises(ValueError, match="model.num_layers=2 must be >= pipeline_parallel_size=3"):
        engine(tp=1, pp=3)
    assert engine(tp=2, pp=2).parallel.world_size == 4


def test_engine_type_checks():
    with pytest.raises(TypeError, match="parallel: expected a ParallelConfig, got dict"):
        EngineConfig(TINY, {"tensor_parallel_size": 2})
    with pytest.raises(ValueError, match="enforce_eager must be True or False, got 'yes'"):
        EngineConfig(TINY, enforce_eager="yes")


def test_num_speculative_tokens():
    assert EngineConfig(TINY, num_speculative_tokens=3).num_speculative_tokens == 3
    with pytest.raises(ValueError, match="num_speculative_tokens must be an integer >= 0, got -1"):
        EngineConfig(TINY, num_speculative_tokens=-1)
    with pytest.raises(ValueError, match="num_speculative_tokens=2 needs an MTP layer"):
        EngineConfig(ModelConfig.tiny(num_mtp_layers=0), num_speculative_tokens=2)


# ---- ModelConfig ---------------------------------------------------------------------------


def dims(cfg: ModelConfig) -> tuple:
    """hidden size, heads, layers, routed experts, experts per token."""
    fields = ("hidden_size", "num_heads", "num_layers", "num_routed_experts", "num_experts_per_tok")
    return tuple(getattr(cfg, f) for f in fields)


def test_model_presets():
    t = ModelConfig.tiny()
    assert dims(t) == (96, 12, 2, 8, 2)
    for tp in (1, 2, 3, 4):
        engine(tp=tp, model=t)  # every test TP size divides the tiny dims
    f = ModelConfig.v4_flash()
    assert dims(f) == (4096, 64, 43, 256, 6)
    assert ModelConfig.preset("v4-flash", num_layers=3).num_layers == 3
    with pytest.raises(ValueError, match="preset: unknown preset 'huge'"):
        ModelConfig.preset("huge")


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(hidden_size=100, num_heads=12), "hidden_size=100 must be divisible by num_heads=12"),
        (dict(num_experts_per_tok=9), "num_experts_per_tok=9 must be <= num_routed_experts=8"),
        (dict(num_layers=0), "num_layers must be a positive integer, got 0"),
        (dict(num_mtp_layers=2), "num_mtp_layers must be 0 or 1, got 2"),
        (dict(capacity_factor=0.0), "capacity_factor must be positive, got 0.0"),
    ],
)
def test_model_config_rules(changes, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.tiny(**changes)


def test_from_hf_config():
    hf = {
        "vocab_size": 129280,
        "hidden_size": 4096,
        "num_hidden_layers": 43,
        "num_attention_heads": 64,
        "n_routed_experts": 256,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 2048,
        "n_shared_experts": 1,
        "routed_scaling_factor": 1.5,
        "num_nextn_predict_layers": 1,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6,
        "architectures": ["DeepseekV4ForCausalLM"],
    }
    cfg = ModelConfig.from_hf_config(hf)
    assert cfg == ModelConfig.v4_flash()
    assert (
        ModelConfig.from_hf_config({"hidden_size": 64, "num_attention_heads": 4}).hidden_size == 64
    )
    assert ModelConfig.from_hf_config({"hc_sinkhorn_iters": 7}).mhc == MhcConfig(sinkhorn_iters=7)
    with pytest.raises(TypeError, match="cfg: expected a mapping"):
        ModelConfig.from_hf_config([("hidden_size", 64)])
