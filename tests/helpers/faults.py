# SPDX-License-Identifier: Apache-2.0
"""Faults injected into worlds of ranks that run back-to-back ``fused_layer`` calls over the shm
transport (``msd.init(..., timeout=TIMEOUT_S)``): a rank killed (SIGKILL) or stopped (SIGSTOP,
then SIGCONT), a rank that calls with another token count or another op, a rank that never calls.
Every rank reports when and what it raised; times are CLOCK_MONOTONIC, the same clock in every
process of the host. Used by tests/transport/test_faults.py and tests/transport/fault_loop.py (and
its looped boundary by the separate hosts' link cut, hosts.py).

Ranks coordinate through files in a scratch directory (``sync``), not through torch.distributed:
its store lives in rank 0, which may itself be the rank that is stopped or killed."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import torch

from mhc_sp import ops
from mhc_sp import reference as R
from mhc_sp.testing import pre_weights, random_inputs

TIMEOUT_S = 5.0
#: Seconds past the timeout within which every survivor must have raised.
GRACE_S = 3.0
#: Faults a plan may hold; "kill" ends a world (its rank is gone), so it comes last.
FAULTS = ("mismatch_tokens", "mismatch_op", "never_calls", "stop", "kill")
#: Tokens and hidden size of the looped boundary (small: 8 ranks share 2 cores).
TOKENS, HIDDEN = 16, 256
#: Tokens a mismatching rank passes: enough to make it grow its workspace (rule 7) while the
#: others copy their rows, so that the header check must catch the two different paths.
GROWING_TOKENS = 2304


def segment_names_recorder() -> list[str]:
    """Records the name of every shm workspace this process joins (their grown segments add a
    suffix to it), by wrapping the extension's entry point."""
    import mhc_sp.distributed as msd

    names: list[str] = []
    init = msd._C.init_shm_transport

    def recording(group, segment, timeout):
        names.append(segment)
        return init(group, segment, timeout)

    msd._C.init_shm_transport = recording
    return names


def leftover_segments(names) -> list[str]:
    """Entries of /dev/shm that belong to the workspaces named (first names as recorded)."""
    shm = Path("/dev/shm")
    found = []
    for name in set(names):
        found += sorted(p.name for p in shm.glob(name.lstrip("/") + "*"))
    return found


def segment_digest() -> str:
    """SHA-256 of every mhc_sp segment this process maps (read in place through the mapping)."""
    h = hashlib.sha256()
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/dev/shm/mhc_sp_" not in line:
                continue
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            h.update(ctypes.string_at(lo, hi - lo))
    return h.hexdigest()


class Sync:
    """Rendezvous through marker files in a directory shared by every rank."""

    def __init__(self, directory: str, step: int):
        self.dir = Path(directory)
        self.step = step

    def mark(self, what: str, rank: int) -> None:
        (self.dir / f"{self.step}.{what}.{rank}").write_text(str(time.monotonic()))

    def count(self, what: str) -> int:
        return len(list(self.dir.glob(f"{self.step}.{what}.*")))

    def wait(self, what: str, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.count(what) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {self.step}: {what}: {self.count(what)} of {count}")
            time.sleep(0.005)


def boundary(group: str, rank: int, world: int, tokens: int):
    """One sharded fused_layer of `tokens` tokens on this rank (seeded inputs, the same on every
    call) and the gathered layer_input it must return."""
    i = random_inputs(tokens, 4, HIDDEN, seed=tokens)
    g = torch.Generator().manual_seed(1000 + rank)
    partial = torch.randn(tokens, HIDDEN, generator=g).to(torch.bfloat16)
    res, post, comb = (R.shard_tokens(i[k], rank, world) for k in ("residual", "post", "comb"))

    def layer():
        return ops.fused_layer(partial, res, post, comb, *pre_weights(i), group, True, tokens)

    def head():
        return ops.fused_head(
            partial,
            res,
            post,
            comb,
            i["head_fn"],
            i["head_scale"],
            i["head_base"],
            group,
            True,
            tokens,
        )

    return layer, head


def loop_until_error(call, expected, limit_s: float) -> dict:
    """Calls `call` back to back until it raises (or `limit_s` passes); every result must be
    `expected`."""
    calls, start = 0, time.monotonic()
    try:
        while time.monotonic() - start < limit_s:
            out = call()
            assert torch.equal(out[3], expected), "a call returned other rows"
            calls += 1
    except Exception as e:  # noqa: BLE001  (reported, judged by the caller)
        return {
            "raised_at": time.monotonic(),
            "type": type(e).__name__,
            "message": str(e),
            "calls": calls,
        }
    return {"raised_at": None, "type": None, "message": None, "calls": calls}


def first_line(message: str | None) -> str | None:
    return message.splitlines()[0] if message else message


def run_step(rank, world, step, fault, victim, delay, sync_dir, pids) -> dict:
    """One fault on a fresh workspace of the WORLD group (collective: every rank calls it)."""
    import torch.distributed as dist

    import mhc_sp.distributed as msd

    group = msd.init(device="cpu", transport="shm", timeout=TIMEOUT_S)
    sync = Sync(sync_dir, step)
    layer, head = boundary(group, rank, world, TOKENS)
    expected = layer()[3]  # a healthy call first, and the rows every later call must return
    injector = (victim + 1) % world
    dist.barrier()
    report = {"fault": fault, "victim": victim, "rank": rank, "started_at": time.monotonic()}

    if fault in ("kill", "stop"):
        sig = signal.SIGKILL if fault == "kill" else signal.SIGSTOP
        if rank == injector:

            def inject():
                time.sleep(delay)
                report["fault_at"] = time.monotonic()
                os.kill(pids[victim], sig)

            threading.Thread(target=inject, daemon=True).start()
        report.update(loop_until_error(layer, expected, delay + 60))
        if fault == "stop":
            if rank != victim:
                # The abandoned segment as the survivors left it, before the victim runs again.
                report["digest_before"] = segment_digest()
                sync.mark("raised", rank)
                if rank == injector:
                    sync.wait("raised", world - 1)
                    report["continued_at"] = time.monotonic()
                    os.kill(pids[victim], signal.SIGCONT)
                sync.wait("victim_raised", 1)
                report["digest_after"] = segment_digest()
            else:
                sync.mark("victim_raised", rank)
    elif fault == "never_calls":
        if rank != victim:
            report["fault_at"] = report["started_at"]
            report.update(loop_until_error(layer, expected, 60))
            sync.mark("raised", rank)
        else:
            sync.wait("raised", world - 1)
            report["fault_at"] = time.monotonic()  # its first call, which must raise at once
            report.update(loop_until_error(layer, expected, 60))
    else:  # mismatch_tokens, mismatch_op
        if rank == victim and fault == "mismatch_tokens":
            call = boundary(group, rank, world, GROWING_TOKENS)[0]
        elif rank == victim:
            call = head
        else:
            call = layer
        report["fault_at"] = time.monotonic()
        try:
            call()
            report.update(raised_at=None, type=None, message=None)
        except Exception as e:  # noqa: BLE001
            report.update(raised_at=time.monotonic(), type=type(e).__name__, message=str(e))
    report["message"] = first_line(report.get("message"))
    return report


def worker(rank, world, plan, sync_dir):
    """Runs `plan` (a list of (fault, victim, delay_s)) on this rank; a final re-init and a
    checked call show the world usable again unless the plan killed a rank. Returns this rank's
    reports and the workspace names it joined."""
    import torch.distributed as dist

    import mhc_sp.distributed as msd

    names = segment_names_recorder()
    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())
    for step, (fault, victim, delay) in enumerate(plan):
        report = run_step(rank, world, step, fault, victim, delay, sync_dir, pids)
        # On disk as it comes: a rank killed later keeps its earlier reports.
        (Path(sync_dir) / f"report.{step}.{rank}.json").write_text(json.dumps(report))
        if fault == "kill":
            return {"segments": names, "reinit": None}
    group = msd.init(device="cpu", transport="shm", timeout=TIMEOUT_S)
    x = torch.full((3, 8), float(rank + 1))
    ok = torch.equal(ops.all_reduce(x, group), torch.full_like(x, world * (world + 1) / 2))
    return {"segments": names, "reinit": ok}


def read_reports(sync_dir, step: int, world: int) -> list[dict | None]:
    """Every rank's report of one step (None for a rank that made none: killed in it)."""
    out = []
    for rank in range(world):
        path = Path(sync_dir) / f"report.{step}.{rank}.json"
        out.append(json.loads(path.read_text()) if path.exists() else None)
    return out


def fresh_world_worker(rank, world):
    """A new world after a fault: init works, a checked boundary call works; returns the names."""
    import mhc_sp.distributed as msd

    names = segment_names_recorder()
    group = msd.init(device="cpu", transport="shm", timeout=TIMEOUT_S)
    layer, _ = boundary(group, rank, world, TOKENS)
    first = layer()[3]
    return {"segments": names, "same": torch.equal(layer()[3], first)}


def detection(reports: list[dict]) -> dict:
    """Per reporting rank: seconds from the fault to the rank's error (None: no error; for a
    stopped rank, from its SIGCONT; for a rank that never called, from its late first call), its
    exception type and first line."""
    live = [r for r in reports if r]
    common = next(r["fault_at"] for r in live if "fault_at" in r)
    resumed = next((r["continued_at"] for r in live if "continued_at" in r), None)
    out = {}
    for r in live:
        at = r.get("raised_at")
        since = r.get("fault_at", common)
        if r["fault"] == "stop" and r["rank"] == r["victim"]:
            since = resumed
        out[r["rank"]] = {
            "seconds": None if at is None else at - since,
            "type": r.get("type"),
            "message": r.get("message"),
        }
    return out


def random_plan(fault: str, world: int, rng: random.Random, max_delay: float = 0.5):
    return [(fault, rng.randrange(world), rng.uniform(0.0, max_delay))]
