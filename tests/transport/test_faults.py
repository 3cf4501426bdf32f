# SPDX-License-Identifier: Apache-2.0
"""Faults injected into worlds of 4 and 8 ranks looping fused_layer over shm with a 5 s timeout
(tests/helpers/faults.py): every survivor raises in time naming the faulty rank, ranks
that disagree on a call all raise ValueError, a stopped rank raises once it runs again and writes
nothing into the segment its peers abandoned, init works again (in the same world, or in a fresh
one after a kill), and no segment is left in /dev/shm. The default suite runs one world of each
size; the rest is marked slow (scripts/slow_tests.sh). tests/transport/fault_loop.py records the
detection times over many random injection points."""

import re

import pytest

from mhc_sp.local_world import run_world
from tests.helpers import faults as F

pytestmark = pytest.mark.distributed

#: A world never takes longer than this (a fault that hangs it fails the test instead).
WORLD_TIMEOUT_S = 180


def run_plan(world, plan, tmp_path):
    killed = {victim for fault, victim, _ in plan if fault == "kill"}
    results = run_world(
        world,
        F.worker,
        plan,
        str(tmp_path),
        expect_exit=killed,
        timeout=WORLD_TIMEOUT_S,
        start="forkserver",
    )
    for victim in killed:
        assert results[victim] is None
    names = {n for r in results if r for n in r["segments"]}
    if killed:  # a world that lost a rank is replaced by a fresh one
        fresh = run_world(world, F.fresh_world_worker, timeout=WORLD_TIMEOUT_S, start="forkserver")
        assert all(r["same"] for r in fresh)
        names |= {n for r in fresh for n in r["segments"]}
    else:
        assert all(r["reinit"] for r in results), "init after the faults"
    assert names, "no workspace was recorded"
    assert F.leftover_segments(names) == [], "segments left in /dev/shm"
    return [F.read_reports(tmp_path, k, world) for k in range(len(plan))]


def check_step(world, fault, victim, reports):
    """What each rank must have raised for one injected fault, and when."""
    seen = F.detection(reports)
    survivors = [r for r in range(world) if r != victim]
    names_victim = re.compile(rf"\brank {victim}\b")
    if fault in ("mismatch_tokens", "mismatch_op"):
        arg = "num_tokens" if fault == "mismatch_tokens" else "group"
        for r in range(world):
            assert seen[r]["type"] == "ValueError", (r, seen[r])
            assert seen[r]["message"].startswith(f"{arg}: ranks disagree on "), seen[r]
            assert seen[r]["seconds"] < F.GRACE_S, seen[r]
        return seen
    if fault == "kill":
        assert victim not in seen
    for r in survivors:
        assert seen[r]["type"] == "RuntimeError", (r, seen[r])
        assert names_victim.search(seen[r]["message"]), (r, seen[r])
        limit = F.GRACE_S if fault == "kill" else F.TIMEOUT_S + F.GRACE_S
        assert seen[r]["seconds"] < limit, (r, seen[r])
        if fault != "kill":  # a live but silent peer is given the whole timeout
            assert seen[r]["seconds"] > F.TIMEOUT_S - 1.0, (r, seen[r])
    if fault in ("stop", "never_calls"):
        assert seen[victim]["type"] == "RuntimeError", seen[victim]
        assert "gave up on the workspace" in seen[victim]["message"], seen[victim]
        assert seen[victim]["seconds"] < F.GRACE_S, seen[victim]
    if fault == "stop":
        for r in survivors:
            report = reports[r]
            assert report["digest_before"] == report["digest_after"], (
                f"rank {victim} wrote into the abandoned workspace after SIGCONT"
            )
    return seen


def check_plan(world, plan, tmp_path):
    for (fault, victim, _), reports in zip(plan, run_plan(world, plan, tmp_path)):
        check_step(world, fault, victim, reports)


def test_faults_world8_mismatch_and_kill(tmp_path):
    """Mismatched token counts (one rank growing its workspace) and ops, then a rank killed in
    the middle of the loop; init afterwards, and a fresh world after the kill."""
    plan = [("mismatch_tokens", 3, 0.0), ("mismatch_op", 0, 0.0), ("kill", 5, 0.3)]
    check_plan(8, plan, tmp_path)


def test_faults_world4_stopped_rank(tmp_path):
    check_plan(4, [("stop", 2, 0.3)], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("world", [4, 8])
def test_faults_every_kind(world, tmp_path):
    plan = [
        ("mismatch_tokens", world - 1, 0.0),
        ("mismatch_op", 1, 0.0),
        ("never_calls", 0, 0.0),
        ("stop", 0, 0.2),
        ("stop", world - 1, 0.4),
        ("kill", 0, 0.3),
    ]
    check_plan(world, plan, tmp_path)


@pytest.mark.slow
def test_faults_world4_kill_and_mismatch(tmp_path):
    check_plan(4, [("mismatch_tokens", 0, 0.0), ("kill", 3, 0.2)], tmp_path)


@pytest.mark.slow
def test_faults_world8_stopped_rank(tmp_path):
    check_plan(8, [("stop", 6, 0.3), ("never_calls", 7, 0.0)], tmp_path)
