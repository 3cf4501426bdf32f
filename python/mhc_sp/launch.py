# SPDX-License-Identifier: Apache-2.0
"""Spawn a world of ranks on one machine: gloo processes on CPU, or one process per GPU with
NCCL. Used by the benchmark CLI and the multi-process tests. Every wait is bounded: a hung or dead
rank makes the whole world fail within the timeout instead of blocking.

Ranks start either as fresh interpreters (``start="spawn"``, the default: each imports torch,
seconds of CPU per rank) or forked from one server process that has imported torch and mhc_sp
once (``start="forkserver"``: a world of 8 starts in about a second on 2 cores instead of a
minute). A forked rank inherits the environment the server started with, so variables set later
(e.g. GLIBC_TUNABLES for one run) need ``spawn``."""

from __future__ import annotations

import socket
import traceback
from datetime import timedelta

import torch.multiprocessing as mp

#: Seconds a collective may wait for a missing peer before gloo raises.
COLLECTIVE_TIMEOUT_S = 15

#: Modules the fork server imports once, before it forks any rank.
FORKSERVER_PRELOAD = ["torch", "mhc_sp", "mhc_sp.distributed", "mhc_sp.reference", "mhc_sp.testing"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, addr, port, backend, threads, collective_timeout, fn, args, queue):
    import torch
    import torch.distributed as dist

    if threads:
        torch.set_num_threads(threads)
    try:
        if "nccl" in backend:
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend,
            init_method=f"tcp://{addr}:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=collective_timeout),
        )
        result = fn(rank, world, *args)
        queue.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001  (report everything to the parent)
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            import mhc_sp.distributed

            mhc_sp.distributed.destroy()
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def run_world(
    world: int,
    fn,
    *args,
    timeout: float = 240.0,
    expect_exit: set[int] = frozenset(),
    backend: str = "gloo",
    threads: int | None = 1,
    collective_timeout: float = COLLECTIVE_TIMEOUT_S,
    start: str = "spawn",
    ranks=None,
    addr: str = "127.0.0.1",
    port: int | None = None,
):
    """Run ``fn(rank, world, *args)`` (a module-level function) on ``world`` spawned ranks of a
    fresh process group; returns the per-rank results. ``backend``: "gloo", or "cpu:gloo,cuda:nccl"
    for one GPU per rank. ``threads``: CPU threads per rank (1: several ranks share the cores;
    None: leave it to ``fn``). ``collective_timeout``: seconds a collective waits for a peer.
    Raises AssertionError with each failing rank's traceback, or when the world does not finish
    within ``timeout`` seconds (every rank is killed). Ranks in ``expect_exit`` may die silently.
    ``start``: "spawn" or "forkserver" (see the module's docstring). A world spread over several
    machines runs ``ranks`` (a subset of ``range(world)``) here, rank 0's machine listening on
    ``addr:port`` for the rendezvous; the result then lists those ranks' results."""
    if start not in ("spawn", "forkserver"):
        raise ValueError(f"start: expected 'spawn' or 'forkserver', got {start!r}")
    ctx = mp.get_context(start)
    if start == "forkserver":
        # Takes effect when this process first starts its server; later calls reuse it.
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    queue = ctx.Queue()
    here = list(range(world)) if ranks is None else list(ranks)
    port = free_port() if port is None else port
    procs = {
        r: ctx.Process(
            target=_entry,
            args=(r, world, addr, port, backend, threads, collective_timeout, fn, args, queue),
            daemon=True,
        )
        for r in here
    }
    for p in procs.values():
        p.start()
    results, errors = {}, {}
    try:
        import queue as queue_mod
        import time

        deadline = time.monotonic() + timeout
        while len(results) + len(errors) < len(here) - len(set(expect_exit) & set(here)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"world of {world} did not finish within {timeout:.0f} s "
                    f"(finished ranks: {sorted(results) + sorted(errors)})"
                )
            try:
                rank, status, payload = queue.get(timeout=min(remaining, 1.0))
            except queue_mod.Empty as empty:
                dead = [
                    r
                    for r, p in procs.items()
                    if p.exitcode not in (None, 0)
                    and r not in results
                    and r not in errors
                    and r not in expect_exit
                ]
                if dead:
                    raise AssertionError(
                        f"ranks {dead} died with exit codes {[procs[r].exitcode for r in dead]}"
                    ) from empty
                continue
            (results if status == "ok" else errors)[rank] = payload
    finally:
        for p in procs.values():
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError(
            "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
        )
    return [results.get(r) for r in here]
