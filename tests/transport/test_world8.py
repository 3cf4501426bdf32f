# SPDX-License-Identifier: Apache-2.0
"""Worlds of 8 ranks, tensor parallelism at DeepSeek-V4's serving size, on the 2 cores of CI
(ranks forked from one server process, so that a world starts in about a second). Every fused
boundary on the shm and the gloo transport, each rank's outputs bitwise those of the
single-device ops given reference.sum_partials (the rank-order sum), shm and gloo bitwise the
same, replicated outputs the same on every rank (worker_fused_ops, tests/helpers/boundaries.py).
The default suite runs one token count; every count of the contract's edge cases, and the model's
--check at tp=8, are marked slow (scripts/slow_tests.sh)."""

import subprocess
import sys

import pytest

from mhc_sp.local_world import run_world
from tests.helpers.boundaries import worker_fused_ops

pytestmark = pytest.mark.distributed

WORLD = 8
#: Token counts around the world size: none, one, fewer than the ranks, exactly as many, one
#: more (the last shard has one real row), and a count that leaves the last ranks empty.
ALL_TOKENS = (0, 1, 7, 8, 9, 37)


def cases(tokens):
    """boundary_cases-style cases (T, extra, n, H, sharded, norm), sharded and replicated."""
    return [(T, 0, 4, 64, sharded, True) for T in tokens for sharded in (True, False)]


def check_world(tokens, reference):
    chosen = cases(tokens)
    results = run_world(
        WORLD, worker_fused_ops, "cpu", "auto", chosen, reference, start="forkserver"
    )
    assert [checked for checked, _ in results] == [len(chosen)] * WORLD
    digests = [d for _, d in results]
    assert len(digests[0]) == len(tokens)  # one replicated case per count
    assert digests == [digests[0]] * WORLD


def test_world8_boundaries():
    """One count (the last rank's shard is all padding), bitwise against the single-device ops
    only: the reference's own per-rank work is what 8 ranks on 2 cores cannot afford here."""
    check_world((9,), reference=False)


@pytest.mark.slow
def test_world8_boundaries_every_token_count():
    check_world(ALL_TOKENS, reference=True)


@pytest.mark.slow
def test_world8_model_check_on_shm():
    """`mhc-sp-bench model -tp 8 --check` of a small model (SP engaged, shm inside the TP group):
    the logits and the draft step match tp=1 within the runner's tolerance."""
    cmd = [
        sys.executable,
        "-m",
        "mhc_sp.bench",
        "model",
        "-tp",
        "8",
        "--tokens",
        "37",
        "--sp-threshold",
        "16",
        "--hidden-size",
        "128",
        "--num-heads",
        "8",
        "--num-speculative-tokens",
        "1",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--check",
        "--timeout",
        "500",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=560)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "check: PASS" in out.stdout, out.stdout
