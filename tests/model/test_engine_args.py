# SPDX-License-Identifier: Apache-2.0
"""EngineArgs: flags to EngineConfig, the engine's flag spellings, argparse errors that name the
flag, and the rules create_engine_config enforces."""

import argparse

import pytest

from mhc_sp.engine.config import (
    CompilationConfig,
    EngineArgs,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    PassConfig,
)


def parse(*argv):
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser(prog="prog"))
    return EngineArgs.from_cli_args(parser.parse_args(list(argv)))


def test_defaults_build_the_tiny_single_rank_engine():
    args = parse()
    assert args == EngineArgs()
    assert args.create_engine_config() == EngineConfig(ModelConfig.tiny())


def test_every_flag_reaches_the_engine_config():
    args = parse(
        "-tp",
        "2",
        "-pp",
        "2",
        "--sp-threshold",
        "16",
        "--max-cudagraph-capture-size",
        "8",
        "--num-speculative-tokens",
        "3",
        "--hidden-size",
        "128",
        "--num-layers",
        "3",
        "--num-heads",
        "8",
        "--num-experts",
        "4",
        "--num-experts-per-tok",
        "1",
        "--moe-intermediate-size",
        "32",
        "--vocab-size",
        "100",
        "--seed",
        "5",
    )
    e = args.create_engine_config()
    assert e.parallel == ParallelConfig(2, 2, 16)
    assert e.compilation == CompilationConfig(PassConfig(True, 16), max_cudagraph_capture_size=8)
    assert not e.enforce_eager and e.moe_backend == "naive" and e.num_speculative_tokens == 3
    assert e.model == ModelConfig.tiny(
        hidden_size=128,
        num_layers=3,
        num_heads=8,
        num_routed_experts=4,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        vocab_size=100,
        seed=5,
    )
    # Long spellings are the same flags; --enforce-eager leaves the compile pass alone.
    long = parse(
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "2",
        "--sp-threshold",
        "16",
        "--enforce-eager",
        "--moe-backend",
        "capacity",
        "--sp-threshold",
        "4",
    )
    assert (long.tensor_parallel_size, long.pipeline_parallel_size, long.sp_threshold) == (2, 2, 4)
    assert long.enforce_eager and long.moe_backend == "capacity"


def test_hidden_size_alone_scales_heads_and_experts():
    assert parse("--hidden-size", "4096").create_model_config().num_heads == 64
    m = parse("--hidden-size", "256").create_model_config()
    assert (m.num_heads, m.moe_intermediate_size) == (32, 128)


def test_threshold_at_or_below_the_capture_size_is_a_value_error():
    args = parse("-tp", "2", "--sp-threshold", "8", "--max-cudagraph-capture-size", "8")
    with pytest.raises(
        ValueError, match="sp_threshold=8 must be greater than max_cudagraph_capture_size=8"
    ):
        args.create_engine_config()
    assert (
        parse("-tp", "2", "--sp-threshold", "9", "--max-cudagraph-capture-size", "8")
        .create_engine_config()
        .parallel.sp_threshold
        == 9
    )


def test_enforce_eager_accepts_any_threshold():
    # --enforce-eager captures nothing (capture size 0), so the refusal above cannot fire.
    e = parse(
        "-tp", "2", "--sp-threshold", "8", "--max-cudagraph-capture-size", "16", "--enforce-eager"
    ).create_engine_config()
    assert e.parallel.sp_threshold == 8 and e.compilation.max_cudagraph_capture_size == 0


@pytest.mark.parametrize("text", ["None", ""])
def test_sp_threshold_none_is_read_as_the_engine_reads_it(text):
    args = parse("-tp", "2", "--sp-threshold", "4", "--sp-threshold", text)
    assert args.sp_threshold is None and not args.create_engine_config().parallel.enable_sp


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--sp-threshold", "0", "expected a positive integer at most 2147483647"),
        ("--sp-threshold", "-4", "expected a positive integer at most 2147483647"),
        ("--sp-threshold", "many", "expected a positive integer or None, got 'many'"),
        ("--sp-threshold", "2.5", "expected a positive integer or None, got '2.5'"),
        (
            "--sp-threshold",
            "1099511627776",
            "expected a positive integer at most 2147483647 (2**31 - 1, the most tokens a "
            "forward can have) or None, got '1099511627776'",
        ),
        ("-tp", "0", "expected a positive integer, got '0'"),
        ("--max-cudagraph-capture-size", "-1", "expected an integer >= 0, got '-1'"),
        ("--num-speculative-tokens", "x", "expected an integer >= 0, got 'x'"),
        ("--moe-backend", "fast", "invalid choice: 'fast'"),
    ],
)
def test_impossible_values_are_argparse_errors_naming_the_flag(flag, value, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse(flag, value)
    err = capsys.readouterr().err
    assert e.value.code == 2
    name = "--tensor-parallel-size/-tp" if flag == "-tp" else flag
    assert f"error: argument {name}: {message}" in err


def test_more_ranks_than_the_world_is_a_clear_error():
    args = parse("-tp", "4")
    with pytest.raises(
        ValueError,
        match="tensor_parallel_size=4 x pipeline_parallel_size=1 "
        "needs 4 ranks, but the world has 2",
    ):
        args.create_engine_config(world_size=2)
    assert args.create_engine_config(world_size=4).parallel.world_size == 4


def test_help_says_what_each_flag_does():
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser(prog="prog"))
    actions = [a for a in parser._actions if a.dest != "help"]
    assert {a.dest for a in actions} == {f for f in EngineArgs.__dataclass_fields__}
    assert all(a.help and len(a.help) > 20 for a in actions), [a.dest for a in actions]
    text = parser.format_help()
    for flag in (
        "--sp-threshold",
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
        "--enforce-eager",
        "--max-cudagraph-capture-size",
        "--moe-backend",
        "--hidden-size",
        "--num-speculative-tokens",
    ):
        assert flag in text


def test_a_subset_of_flags():
    parser = EngineArgs.add_cli_args(
        argparse.ArgumentParser(prog="prog"),
        only=("tensor_parallel_size", "max_cudagraph_capture_size"),
        defaults={"tensor_parallel_size": 2},
    )
    args = EngineArgs.from_cli_args(parser.parse_args(["--max-cudagraph-capture-size", "4"]))
    assert args == EngineArgs(tensor_parallel_size=2, max_cudagraph_capture_size=4)
    assert "ranks each layer's weights are split over (default: 2)" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--sp-threshold", "4"])
    with pytest.raises(ValueError, match=r"only: unknown EngineArgs fields \['tp'\]"):
        EngineArgs.add_cli_args(argparse.ArgumentParser(), only=("tp",))
    with pytest.raises(ValueError, match=r"defaults: unknown EngineArgs fields \['hidden'\]"):
        EngineArgs.add_cli_args(argparse.ArgumentParser(), defaults={"hidden": 4096})
