# SPDX-License-Identifier: Apache-2.0
"""mhc_sp's vLLM plugin without vLLM: its options and their one-line refusals, the on/off decision
for each engine setup, the per-forward ``sharded`` decision, ``register()`` (cheap, idempotent,
version-gated, against a stand-in ``vllm`` module), the entry point pyproject declares, and the
boundaries with their counts on two real ranks. The plugin inside vLLM itself is
scripts/vllm_e2e.sh's subject (the test that needs vLLM here is skipped without it)."""

import importlib
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path

import pytest
import torch

import mhc_sp.integrations.vllm as plugin
from mhc_sp.config import MhcConfig
from mhc_sp.engine.runner import plan
from mhc_sp.integrations.vllm import options as opts
from mhc_sp.integrations.vllm.options import (
    EngineFacts,
    OptionError,
    Options,
    decide,
    is_sharded,
    parse_options,
)
from mhc_sp.local_world import run_world

ROOT = Path(__file__).resolve().parents[2]
ON = EngineFacts(vllm_version="0.32.0", platform="cpu", tensor_parallel_size=2)


# ---- options -----------------------------------------------------------------------------------


def test_no_mhc_sp_key_means_off():
    assert parse_options(None) is None
    assert parse_options({}) is None
    assert parse_options({"gdn_prefill_backend": "auto"}) is None
    d = decide({}, ON)
    assert (d.on, d.options, d.message) == (False, None, None)


def test_good_options():
    assert parse_options({"mhc_sp": {"sp_threshold": 64}}) == Options(64, "auto", None)
    got = parse_options({"mhc_sp": {"sp_threshold": 1, "transport": "gloo", "timeout": 30}})
    assert got == Options(1, "gloo", 30.0)
    assert parse_options({"mhc_sp": {"sp_threshold": 2**31 - 1}}).sp_threshold == 2**31 - 1


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"sp_threshold": 0}, "sp_threshold"),
        ({"sp_threshold": -4}, "sp_threshold"),
        ({"sp_threshold": 2**31}, "sp_threshold"),
        ({"sp_threshold": 64.0}, "sp_threshold"),
        ({"sp_threshold": "64"}, "sp_threshold"),
        ({"sp_threshold": True}, "sp_threshold"),
        ({"sp_threshold": None}, "sp_threshold"),
        ({}, "sp_threshold"),
        ({"sp_threshold": 8, "transport": "nccl"}, "transport"),
        ({"sp_threshold": 8, "transport": 1}, "transport"),
        ({"sp_threshold": 8, "timeout": 0}, "timeout"),
        ({"sp_threshold": 8, "timeout": float("inf")}, "timeout"),
        ({"sp_threshold": 8, "timeout": "10"}, "timeout"),
        ({"sp_threshold": 8, "sp_treshold": 8}, "sp_treshold"),
        ({"enable_sp": True}, "enable_sp"),
    ],
)
def test_bad_option_is_refused_in_one_line_naming_it(raw, key):
    with pytest.raises(OptionError) as e:
        parse_options({"mhc_sp": raw})
    message = str(e.value)
    assert message.startswith(f"additional_config.mhc_sp.{key}: "), message
    assert "\n" not in message
    assert isinstance(e.value, ValueError)


def test_options_that_are_not_a_dict_are_refused():
    with pytest.raises(OptionError, match=r"^additional_config\.mhc_sp: expected a dict"):
        parse_options({"mhc_sp": 64})


def test_bad_options_are_refused_whatever_the_setup():
    """Refused before any setup question: a typo never passes silently because tp is 1."""
    facts = EngineFacts(vllm_version="0.32.0", platform="cpu", tensor_parallel_size=1)
    with pytest.raises(OptionError, match="sp_threshold"):
        decide({"mhc_sp": {"sp_threshold": 0}}, facts)


# ---- the decision per engine setup ---------------------------------------------------------------


ASK = {"mhc_sp": {"sp_threshold": 32}}


def test_on_says_threshold_and_transport():
    d = decide({"mhc_sp": {"sp_threshold": 32, "transport": "shm"}}, ON)
    assert d.on and not d.refused and d.options == Options(32, "shm", None)
    assert "sp_threshold=32" in d.message and "transport=shm" in d.message
    assert "\n" not in d.message


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(tensor_parallel_size=1), "tensor_parallel_size=1"),
        (dict(platform="cuda"), "cuda platform"),
        (dict(platform="rocm"), "rocm platform"),
        (dict(pipeline_parallel_size=2), "pipeline parallelism"),
        (dict(speculative=True), "speculative decoding"),
        (dict(enforce_eager=False), "compiled mode"),
        (dict(vllm_version="0.33.0"), "not tested with vLLM 0.33.0"),
    ],
)
def test_what_it_cannot_serve_is_refused_in_one_line_and_vllm_left_alone(change, words):
    facts = EngineFacts(**{**ON.__dict__, **change})
    d = decide(ASK, facts)
    assert not d.on
    assert d.refused is (change != dict(tensor_parallel_size=1))  # tp = 1 is no refusal
    assert words in d.message and "vLLM's own model runs unchanged" in d.message
    assert d.message.startswith("mhc_sp: ") and "\n" not in d.message


def test_tested_versions_are_named_and_local_suffixes_ignored():
    assert opts.TESTED_VLLM_VERSIONS == ("0.32.0",)
    assert decide(ASK, EngineFacts(**{**ON.__dict__, "vllm_version": "0.32.0+cpu"})).on
    assert opts.release("v0.32.0") == "0.32.0"
    refused = decide(ASK, EngineFacts(**{**ON.__dict__, "vllm_version": "0.31.2"}))
    assert "(tested: 0.32.0)" in refused.message


# ---- the sharded decision --------------------------------------------------------------------


def test_sharded_decision_is_the_seeds_rule():
    assert is_sharded(32, 2, 32) and is_sharded(33, 2, 32)
    assert not is_sharded(31, 2, 32)
    assert not is_sharded(1, 2, 1)  # fewer tokens than ranks
    assert is_sharded(2, 2, 1)
    assert not is_sharded(4096, 1, 32)  # tp = 1: no SP
    assert not is_sharded(4096, 2, None)  # no threshold: no SP
    for T in range(0, 70):
        for tp in (1, 2, 3, 8):
            for thr in (None, 1, 2, 7, 32, 64):
                assert is_sharded(T, tp, thr) == plan.is_sharded(T, tp, thr), (T, tp, thr)


# ---- register() --------------------------------------------------------------------------------


class _Registry:
    def __init__(self):
        self.calls = []

    def register_model(self, arch, cls):
        self.calls.append((arch, cls))


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in ``vllm`` module (its version and ModelRegistry), and a fresh register()."""
    module = types.ModuleType("vllm")
    module.__version__ = "0.32.0"
    module.ModelRegistry = _Registry()
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(plugin, "_registered", False)
    return module


def test_register_is_idempotent_and_registers_the_lazy_class(fake_vllm):
    assert plugin.register() is True
    assert plugin.register() is False
    assert plugin.register() is False
    assert fake_vllm.ModelRegistry.calls == [("DeepseekV4ForCausalLM", plugin.MODEL_CLASS)]


def test_register_is_cheap(fake_vllm):
    """It imports nothing of vLLM's model code nor the plugin's model module."""
    sys.modules.pop("mhc_sp.integrations.vllm.model", None)
    before = set(sys.modules)
    plugin.register()
    new = set(sys.modules) - before
    assert "mhc_sp.integrations.vllm.model" not in new
    assert not [m for m in new if m.startswith("vllm")], new


def test_register_on_an_untested_vllm_leaves_it_alone(fake_vllm, caplog):
    fake_vllm.__version__ = "0.40.1"
    with caplog.at_level(logging.WARNING, logger="vllm.mhc_sp"):
        assert plugin.register() is False
        assert plugin.register() is False
    assert fake_vllm.ModelRegistry.calls == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "0.40.1" in lines[0] and "0.32.0" in lines[0]


def test_counts_start_at_zero():
    assert set(plugin.counts()) == {"forwards", "sharded_forwards", "sharded", "replicated"}


# ---- the entry point ---------------------------------------------------------------------------


def test_pyproject_declares_the_entry_point():
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    group = project["entry-points"]["vllm.general_plugins"]
    assert group == {"mhc_sp": "mhc_sp.integrations.vllm:register"}
    module, attr = group["mhc_sp"].split(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_the_registered_class_is_where_the_registry_will_look():
    module, cls = plugin.MODEL_CLASS.split(":")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin.endswith("integrations/vllm/model.py")
    assert f"class {cls}(" in Path(spec.origin).read_text()


def test_the_model_against_vllm():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed here; scripts/vllm_e2e.sh runs the plugin inside vLLM")
    from vllm.models.deepseek_v4 import DeepseekV4ForCausalLM

    from mhc_sp.integrations.vllm.model import MhcSpDeepseekV4ForCausalLM

    assert issubclass(MhcSpDeepseekV4ForCausalLM, DeepseekV4ForCausalLM)


# ---- the boundaries on two ranks ---------------------------------------------------------------


def _hc(g, n, H):
    mix = n * (n + 2)
    return (
        torch.randn(mix, n * H, generator=g) * (n * H) ** -0.5,
        0.5 + torch.rand(3, generator=g),
        torch.randn(mix, generator=g) * 0.5,
        (1 + 0.1 * torch.randn(H, generator=g)).to(torch.bfloat16),
    )


def _forward(b, T, H, layers, rank):
    """One forward through the boundaries as the plugin's model runs it, stand-in sublayers
    (each rank's partial a different random (T, H))."""
    g = torch.Generator().manual_seed(7)
    n = b.cfg.hc_mult
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    weights = [_hc(g, n, H) for _ in range(2 * layers)]
    head = (torch.randn(n, n * H, generator=g) * (n * H) ** -0.5, torch.rand(1, generator=g) + 0.5)
    head_base = torch.randn(n, generator=g)
    partials = [torch.randn(T, H, generator=g).to(torch.bfloat16) for _ in range(2 * layers * 2)]
    b.begin(T)
    residual, post, comb, h = b.entry(x, *weights[0])
    for i in range(1, 2 * layers):
        partial = partials[2 * i + rank]
        residual, post, comb, h = b.layer(partial, residual, post, comb, *weights[i])
    hidden = b.head(partials[rank], residual, post, comb, head[0], head[1], head_base)
    return hidden, b.end()


def worker_boundaries(rank, world, counts_prefix):
    import os

    import torch.distributed as dist

    from mhc_sp.integrations.vllm.boundaries import COUNTS_ENV, Boundaries, totals

    os.environ[COUNTS_ENV] = counts_prefix
    H, layers = 64, 2
    sp = Boundaries(dist.group.WORLD, rank, world, Options(sp_threshold=8), MhcConfig())
    rep = Boundaries(dist.group.WORLD, rank, world, Options(sp_threshold=10**6), MhcConfig())
    out = {}
    for T in (3, 8, 13):
        a, ra = _forward(sp, T, H, layers, rank)
        b, rb = _forward(rep, T, H, layers, rank)
        out[T] = (torch.equal(a, b), ra, rb, tuple(a.shape))
    return out, totals(), sp.transport


def test_boundaries_count_each_forward_and_sharded_equals_replicated(tmp_path):
    prefix = str(tmp_path / "counts")
    results = run_world(2, worker_boundaries, prefix, start="forkserver", timeout=180)
    boundaries = 2 * 2 + 1
    for rank, (out, totals, transport) in enumerate(results):
        assert transport == "shm"
        for T, (equal, sharded_rec, replicated_rec, shape) in out.items():
            assert equal, f"rank {rank}, {T} tokens: sharded and replicated hidden states differ"
            assert shape == (T, 64)
            want = T >= 8
            assert sharded_rec["sharded"] is want
            assert (sharded_rec["sharded_boundaries"], sharded_rec["replicated_boundaries"]) == (
                (boundaries, 0) if want else (0, boundaries)
            )
            assert (replicated_rec["sharded"], replicated_rec["replicated_boundaries"]) == (
                False,
                boundaries,
            )
        assert totals == {
            "forwards": 6,
            "sharded_forwards": 2,
            "sharded": 2 * boundaries,
            "replicated": 4 * boundaries,
        }
        lines = Path(f"{prefix}.rank{rank}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert [r["tokens"] for r in records] == [3, 3, 8, 8, 13, 13]
        assert [r["sharded"] for r in records] == [False, False, True, False, True, False]
        assert all(r["rank"] == rank for r in records)
