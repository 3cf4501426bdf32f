# SPDX-License-Identifier: Apache-2.0
"""``runner.plan`` against a separate, direct transcription of the engine's rules, for every
(tokens, tp, sp_threshold, capture size, enforce_eager) in a small box, on CPU and CUDA (only the
plan is computed: no device is needed), for main forwards and MTP draft steps."""

import itertools
import warnings

import pytest

from mhc_sp.engine.config import CompilationConfig, EngineConfig, ModelConfig, ParallelConfig
from mhc_sp.engine.runner import ForwardPlan, is_sharded, plan_forward

TINY = ModelConfig.tiny()  # 12 heads, vocab 240, experts 48 wide: tp 1, 2, 3, 4, 6 all divide them
TOKENS = range(1, 41)
TP = (1, 2, 3, 4, 6)
THRESHOLDS = (None, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 17, 33)
CAPTURE = (0, 1, 2, 4, 8, 16)


# ---- the engine's rules, transcribed on their own ------------------------------------------


def engine_capture_sizes(max_size):
    """Sizes the engine captures: 1, 2, 4, then every multiple of 8, and the maximum itself."""
    sizes = [s for s in (1, 2, 4) if s <= max_size] + list(range(8, max_size + 1, 8))
    if max_size and max_size not in sizes:
        sizes.append(max_size)
    return sizes


def engine_accepts(tp, threshold, capture, eager):
    """Under enforce_eager the engine captures nothing (its capture size is 0), so the check
    that sp_threshold lies above the capture size cannot fire there."""
    if eager:
        capture = 0
    sp = tp > 1 and threshold is not None
    return not (sp and threshold <= capture)


def engine_plan(tokens, tp, threshold, capture, eager, cuda, draft):
    """(tokens, padded, sharded, graph size) as the engine runs the forward."""
    sp = tp > 1 and threshold is not None
    if draft:
        # The draft layer decides on its own count; a sharded step pads inside its shard.
        sharded = sp and tokens >= threshold and tokens >= tp
        padded = -(-tokens // tp) * tp if sharded else tokens
    else:
        # The runner pads a forward of at least sp_threshold tokens to a multiple of tp and
        # decides on the padded count.
        padded = -(-tokens // tp) * tp if sp and tokens >= threshold else tokens
        sharded = sp and padded >= threshold and padded >= tp
    graph = None
    if cuda and not eager and capture and not sharded and tokens <= capture:
        graph = min(s for s in engine_capture_sizes(capture) if s >= tokens)
        padded = graph
    return tokens, padded, sharded, graph


# ---- the comparison --------------------------------------------------------------------------


def make_engine(tp, threshold, capture, eager):
    return EngineConfig(
        TINY,
        ParallelConfig(tp, 1, threshold),
        CompilationConfig(max_cudagraph_capture_size=capture),
        enforce_eager=eager,
    )


def test_every_plan_matches_the_engine():
    configs = plans = 0
    for tp, threshold, capture, eager in itertools.product(TP, THRESHOLDS, CAPTURE, (False, True)):
        if not engine_accepts(tp, threshold, capture, eager):
            with pytest.raises(ValueError, match=f"sp_threshold={threshold} must be greater"):
                make_engine(tp, threshold, capture, eager)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a threshold maps into the pass: nothing to warn
            engine = make_engine(tp, threshold, capture, eager)
        configs += 1
        for device, draft in itertools.product(("cpu", "cuda"), (False, True)):
            for tokens in TOKENS:
                expected = engine_plan(
                    tokens, tp, threshold, capture, eager, device == "cuda", draft
                )
                got = plan_forward(tokens, engine, device, draft=draft)
                assert got == ForwardPlan(*expected), (tp, threshold, capture, eager, device, draft)
                plans += 1
    assert configs > 500 and plans > 80_000  # the box was really covered


def test_the_cases_where_drafts_and_forwards_differ():
    # Fewer tokens than ranks but at least the threshold: a main forward pads up to tp and
    # shards; a draft step of the same count does not (as the engine's draft layer).
    e = make_engine(4, 2, 0, False)
    assert plan_forward(3, e) == ForwardPlan(3, 4, True)
    assert plan_forward(3, e, draft=True) == ForwardPlan(3, 3, False)
    # A sharded draft step whose count is not a multiple of tp still pads (rows trimmed later).
    assert plan_forward(5, e, draft=True) == ForwardPlan(5, 8, True)
    assert plan_forward(4, e, draft=True) == ForwardPlan(4, 4, True)


def test_is_sharded_is_the_predicate():
    for n, tp, threshold in itertools.product(range(1, 20), TP, THRESHOLDS):
        sp = tp > 1 and threshold is not None
        assert is_sharded(n, tp, threshold) == (sp and n >= threshold and n >= tp)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_token_count_must_be_positive(bad):
    with pytest.raises(ValueError, match=f"num_tokens: expected a positive int, got {bad!r}"):
        plan_forward(bad, make_engine(2, 4, 0, False))
