# SPDX-License-Identifier: Apache-2.0
"""Spawn a world of ranks on one machine: gloo processes on CPU, or one process per GPU with
NCCL. Used by the benchmark CLI and the multi-process tests. Every wait is bounded: a hung or dead
rank makes the whole world fail within the timeout instead of blocking.

Ranks start either as fresh interpreters (``start="spawn"``, the default: each imports torch,
seconds of CPU per rank) or forked from one server process that has imported torch and mhc_sp
once (``start="forkserver"``: a world of 8 starts in about a second on 2 cores instead of a
minute). A forked rank inherits the environment the server started with, so variables set later
(e.g. GLIBC_TUNABLES for one run) need ``spawn``.

Ranks never outlive the process that started them. Each rank ignores SIGINT (Ctrl-C reaches the
whole terminal group: the parent decides for the world) and takes SIGTERM as "stop": it leaves
what it runs by :class:`Stopped`, closes its transports (which removes their shared-memory
segments) and exits, or is ended :data:`STOP_GRACE_S` later if that hangs. It receives that SIGTERM
from the parent when the world ends early (an interrupt, an error, a timeout), and from itself when
the parent is gone however it went, SIGKILL included: a thread watches the parent's lifeline (the
pipe that closes when the parent exits) and the kernel sends SIGTERM on the parent's death
(``PR_SET_PDEATHSIG``) should that thread not get to run."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import threading
import time
import traceback
from datetime import timedelta

import torch.multiprocessing as mp

#: Seconds a collective may wait for a missing peer before gloo raises.
COLLECTIVE_TIMEOUT_S = 15
#: Seconds a rank told to stop has to close its transports and exit before it is ended.
STOP_GRACE_S = 0.5
#: Exit status of a rank that stopped when told to (128 + SIGTERM, as a shell reports it).
STOPPED_EXIT = 128 + signal.SIGTERM
#: ``prctl`` option: the signal this process receives when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1


class Stopped(BaseException):
    """A stop signal arrived (SIGTERM; SIGINT where :func:`stop_on_signals` says so): the run
    ends, running its cleanup on the way out. Not an Exception: nothing catches it by accident."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class stop_on_signals:
    """While active (in the main thread), SIGTERM raises :class:`Stopped` where this thread runs,
    and SIGINT KeyboardInterrupt even where this process started with SIGINT ignored (as a
    shell starts background jobs, and Python then leaves it ignored): a signal to the command
    alone must end it. The previous handlers are restored afterwards."""

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {
                signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_stopped),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
            }
        return self

    def __exit__(self, *exc):
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        return False


def _raise_stopped(signum, frame):
    raise Stopped(signum)


# ---- in each rank ---------------------------------------------------------------------------


def _end_after(seconds: float) -> None:
    """End this process ``seconds`` from now, whatever it is doing then."""

    def end():
        time.sleep(seconds)
        os._exit(STOPPED_EXIT)

    threading.Thread(target=end, name="rank-stop-deadline", daemon=True).start()


def _rank_stop(signum, frame):
    """SIGTERM in a rank: stop once (a second signal during the cleanup is ignored), within
    :data:`STOP_GRACE_S`."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _end_after(STOP_GRACE_S)
    raise Stopped(signum)


def _watch_parent(lifeline) -> None:
    """Wait until the parent is gone (its end of ``lifeline`` closed), then stop this rank."""
    from multiprocessing.connection import wait

    wait([lifeline])
    os.kill(os.getpid(), signal.SIGTERM)  # handled in the main thread, where the work runs


def _guard_rank() -> None:
    """This rank's stop rules (see the module's docstring); called first thing in the rank."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _rank_stop)
    try:  # Linux: the kernel's own backstop
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    parent = mp.parent_process()
    if parent is not None and parent.sentinel is not None:
        watch = threading.Thread(
            target=_watch_parent, args=(parent.sentinel,), name="rank-parent-watch", daemon=True
        )
        watch.start()


#: Modules the fork server imports once, before it forks any rank.
FORKSERVER_PRELOAD = ["torch", "mhc_sp", "mhc_sp.distributed", "mhc_sp.reference", "mhc_sp.testing"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, addr, port, backend, threads, collective_timeout, fn, args, queue):
    _guard_rank()
    import torch
    import torch.distributed as dist

    if threads:
        torch.set_num_threads(threads)
    stopped = False
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
    except Stopped:  # told to stop: the parent knows why, and may be gone
        stopped = True
    except BaseException:  # noqa: BLE001  (report everything to the parent)
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            import mhc_sp.distributed

            mhc_sp.distributed.destroy()
            if dist.is_initialized():
                dist.destroy_process_group()
        except BaseException:  # noqa: BLE001  (a stop signal during the cleanup included)
            pass
    if stopped:
        os._exit(STOPPED_EXIT)  # no wait for a queue nobody may read any more


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
    results, errors = {}, {}
    try:
        _start_deaf_to_ctrl_c(procs.values())
        import queue as queue_mod

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
    except BaseException:
        _stop_ranks(procs.values())
        raise
    finally:
        for p in procs.values():
            if p.pid is not None:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
    if errors:
        raise AssertionError(
            "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
        )
    return [results.get(r) for r in here]


def _start_deaf_to_ctrl_c(procs) -> None:
    """Start the ranks with SIGINT blocked, a mask they keep through their start-up (seconds of
    imports, before :func:`_guard_rank` runs): a Ctrl-C then reaches the parent alone, which
    stops the world. In this process SIGINT is only held back meanwhile, not lost."""
    held = threading.current_thread() is threading.main_thread()
    if held:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for p in procs:
            p.start()
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _stop_ranks(procs) -> None:
    """Stop the ranks still running: SIGTERM (each closes its transports and exits), and after
    twice :data:`STOP_GRACE_S` SIGKILL for any left; returns when every one has exited."""
    started = [p for p in procs if p.pid is not None]
    for p in started:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 2 * STOP_GRACE_S
    for p in started:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
