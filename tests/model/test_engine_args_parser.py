# SPDX-License-Identifier: Apache-2.0
"""The engine flags exactly as the parser holds them: every group, option string, dest, action,
default, type, choices, metavar and help text, frozen here so that a change to how
``EngineArgs.add_cli_args`` builds them cannot change what a user sees or passes."""

import argparse

import pytest

from mhc_sp.engine.config import EngineArgs

# The flags of the three ways the tools call add_cli_args: all of them (serve, mhc-sp-bench model),
# a few with other defaults (mhc-sp-bench tune) and one alone (mhc-sp-bench project). Per group
# title, each flag as (option strings, dest, action class, default, type name, choices, metavar,
# help).

ALL_FLAGS = {
    "positional arguments": [],
    "options": [],
    "parallelism": [
        (
            ("--tensor-parallel-size", "-tp"),
            "tensor_parallel_size",
            "_StoreAction",
            1,
            "positive_int",
            None,
            "N",
            "ranks each layer's weights are split over (default: 1)",
        ),
        (
            ("--pipeline-parallel-size", "-pp"),
            "pipeline_parallel_size",
            "_StoreAction",
            1,
            "positive_int",
            None,
            "N",
            "pipeline stages the layers are split into (default: 1)",
        ),
        (
            ("--sp-threshold",),
            "sp_threshold",
            "_StoreAction",
            None,
            "optional_token_count",
            None,
            "N",
            (
                "sequence parallelism: forwards of at least N tokens keep the mHC residual stream "
                "split by tokens over the tensor-parallel ranks (needs -tp > 1; None: off; "
                "`mhc-sp-bench tune` measures a good N for this machine) (default: off)"
            ),
        ),
    ],
    "execution": [
        (
            ("--enforce-eager",),
            "enforce_eager",
            "_StoreTrueAction",
            False,
            None,
            None,
            None,
            "run every forward eagerly: no CUDA graphs and no compile pass",
        ),
        (
            ("--max-cudagraph-capture-size",),
            "max_cudagraph_capture_size",
            "_StoreAction",
            0,
            "non_negative_int",
            None,
            "N",
            (
                "capture CUDA graphs for forwards of up to N tokens (CUDA only; 0: none; "
                "--sp-threshold must be above it) (default: 0)"
            ),
        ),
        (
            ("--num-speculative-tokens",),
            "num_speculative_tokens",
            "_StoreAction",
            0,
            "non_negative_int",
            None,
            "K",
            "MTP draft steps after each forward, each fed the previous step's stream (default: 0)",
        ),
    ],
    "model size (the small test model unless given)": [
        (
            ("--hidden-size",),
            "hidden_size",
            "_StoreAction",
            None,
            "positive_int",
            None,
            "H",
            "hidden size (default: 96)",
        ),
        (
            ("--num-layers",),
            "num_layers",
            "_StoreAction",
            None,
            "positive_int",
            None,
            "L",
            "decoder layers (default: 2)",
        ),
        (
            ("--num-heads",),
            "num_heads",
            "_StoreAction",
            None,
            "positive_int",
            None,
            "N",
            "attention heads (default: hidden/64 from 1024 up, else hidden/8)",
        ),
        (
            ("--num-experts",),
            "num_experts",
            "_StoreAction",
            None,
            "positive_int",
            None,
            "E",
            "routed experts per MoE layer (default: 8)",
        ),
        (
            ("--num-experts-per-tok",),
            "num_experts_per_tok",
            "_StoreAction",
            None,
            "positive_int",
            None,
            "K",
            "experts each token is routed to (default: 2)",
        ),
        (
            ("--moe-intermediate-size",),
            "moe_intermediate_size",
            "_StoreAction",
            None,
            "positive_int",
            None,
            "I",
            "intermediate size of each expert (default: hidden/2)",
        ),
        (
            ("--vocab-size",),
            "vocab_size",
            "_StoreAction",
            None,
            "positive_int",
            None,
            "V",
            "vocabulary size (default: 240)",
        ),
        (
            ("--moe-backend",),
            "moe_backend",
            "_StoreAction",
            "naive",
            None,
            ["capacity", "naive"],
            None,
            (
                "MoE implementation: naive computes every routed token; capacity drops tokens "
                "beyond each expert's capacity and cannot run with --sp-threshold (default: naive)"
            ),
        ),
        (
            ("--seed",),
            "seed",
            "_StoreAction",
            0,
            "non_negative_int",
            None,
            None,
            "seed of the synthetic weights (default: 0)",
        ),
    ],
}


def with_default(flag: tuple, default) -> tuple:
    """``flag`` as ALL_FLAGS has it, for a parser that gives it another default."""
    *head, _, kind, choices, metavar, help = flag
    help = help.rsplit(" (default: ", 1)[0] + f" (default: {default})"
    return (*head, default, kind, choices, metavar, help)


TP_FLAG, CAPTURE_FLAG = ALL_FLAGS["parallelism"][0], ALL_FLAGS["execution"][1]
HIDDEN_FLAG = ALL_FLAGS["model size (the small test model unless given)"][0]
TUNE_FLAGS = {
    "positional arguments": [],
    "options": [],
    "parallelism": [with_default(TP_FLAG, 2)],
    "execution": [CAPTURE_FLAG],
    "model size (the small test model unless given)": [with_default(HIDDEN_FLAG, 4096)],
}
PROJECT_FLAGS = {
    "positional arguments": [],
    "options": [],
    "parallelism": [],
    "execution": [CAPTURE_FLAG],
    "model size (the small test model unless given)": [],
}


def flags(parser: argparse.ArgumentParser) -> dict:
    """Every group of ``parser`` with its flags as the constants above spell them (argparse's own
    ``--help`` left out)."""
    out = {}
    for group in parser._action_groups:
        out[group.title] = [
            (
                tuple(a.option_strings),
                a.dest,
                type(a).__name__,
                a.default,
                a.type and a.type.__name__,
                a.choices,
                a.metavar,
                a.help,
            )
            for a in group._group_actions
            if a.dest != "help"
        ]
    return out


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({}, ALL_FLAGS),
        (
            {
                "only": ("tensor_parallel_size", "hidden_size", "max_cudagraph_capture_size"),
                "defaults": {"tensor_parallel_size": 2, "hidden_size": 4096},
            },
            TUNE_FLAGS,
        ),
        ({"only": ("max_cudagraph_capture_size",)}, PROJECT_FLAGS),
    ],
)
def test_the_flags_are_exactly_as_frozen(kwargs, expected):
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser(prog="prog"), **kwargs)
    assert flags(parser) == expected
    # The rest of each flag is what its kind implies: a value, or a switch with nothing after.
    for action in parser._actions[1:]:  # [0] is argparse's own --help
        switch = isinstance(action, argparse._StoreTrueAction)
        expected_rest = (0, True, False) if switch else (None, None, False)
        assert (action.nargs, action.const, action.required) == expected_rest, action.dest
