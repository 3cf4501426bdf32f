# SPDX-License-Identifier: Apache-2.0
"""Ranks started as interpreters of their own (``python -c CODE``), for what only a process's own
end shows (the exit hooks that tear the transports down): ranks 0 .. world-1 of a
torch.distributed world on this host, MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK set, run from
the repository root (so that CODE imports ``tests.*`` as the tests do). Each must exit 0 having
printed one line ``REPORT <json>``. Used by tests/transport/test_teardown.py and
tests/cuda/test_nccl.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

from mhc_sp.local_world import free_port

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "REPORT "


def run_reporting_ranks(code: str, world: int = 2, timeout: float = 120, **env: str) -> list:
    """The ranks' reports, rank by rank; `env`: variables set in every rank besides the world's. A
    rank still running `timeout` seconds into the wait for it (a hang at exit) fails the caller,
    and every rank still running is killed."""
    world_env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(world),
        **env,
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=dict(world_env, RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    reports = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)  # a hang at exit fails here
            assert p.returncode == 0, err
            lines = [line for line in out.splitlines() if line.startswith(PREFIX)]
            assert len(lines) == 1, out + err
            reports.append(json.loads(lines[0][len(PREFIX) :]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return reports
