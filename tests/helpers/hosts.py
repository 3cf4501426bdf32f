# SPDX-License-Identifier: Apache-2.0
"""Hosts that are really separate, on one machine: each "host" is a set of Linux namespaces of
its own (network, UTS for its hostname, mount with a private /dev/shm), made with
``unshare --net --uts --mount``, and the hosts are joined by a veth pair whose addresses the
harness assigns inside those namespaces; traffic never leaves them. A driver process in each host
(``python -m tests.helpers.hosts drive ...`` from the repository root, entered with nsenter)
starts that host's ranks of one world with mhc_sp.local_world.run_world and writes their results as
JSON. Needs root (namespaces, mounts, links); tests skip without it. Used by
tests/transport/test_hosts.py and tests/transport/hosts_check.py."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: The repository root: a driver runs from it, so that it and its ranks import ``tests.*``.
ROOT = Path(__file__).resolve().parents[2]
#: The hosts' link: a /24 of the private range, used only inside the hosts' own namespaces.
SUBNET = "10.213.7"
LINK = "veth0"
#: Any port: each host has a network namespace of its own.
PORT = 29517
#: Seconds a gloo collective between the hosts waits before it raises.
COLLECTIVE_TIMEOUT_S = 5.0


def unavailable() -> str | None:
    """Why separate hosts cannot be made here (None: they can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "separate hosts need root (network namespaces, a tmpfs mount, a veth pair)"
    missing = [t for t in ("unshare", "nsenter", "ip") if shutil.which(t) is None]
    if missing:
        return f"separate hosts need {', '.join(missing)} (util-linux, iproute2)"
    return None


class Hosts:
    """Two hosts joined by a veth pair; host k has address SUBNET.(k + 1) on LINK."""

    def __init__(self, count: int = 2):
        self.count = count
        self.dir = Path(tempfile.mkdtemp(prefix="mhc_sp_hosts_"))
        self.hosts: list[subprocess.Popen] = []
        self.drivers: list[subprocess.Popen] = []

    def addr(self, k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    def __enter__(self) -> "Hosts":
        try:
            for k in range(self.count):
                ready = self.dir / f"ready.{k}"
                script = (
                    f"hostname mhc-sp-host-{k} && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && "
                    f"ip link set lo up && touch {ready} && exec sleep 3600"
                )
                self.hosts.append(
                    subprocess.Popen(
                        ["unshare", "--net", "--uts", "--mount", "--fork", "sh", "-c", script],
                        start_new_session=True,
                        stderr=subprocess.PIPE,
                    )
                )
                deadline = time.monotonic() + 20
                while not ready.exists():
                    if self.hosts[k].poll() is not None or time.monotonic() > deadline:
                        err = self.hosts[k].stderr.read().decode() if self.hosts[k].stderr else ""
                        raise OSError(f"cannot make host {k}: {err.strip() or 'timed out'}")
                    time.sleep(0.01)
            a, b = (str(h.pid) for h in self.hosts[:2])
            self._ip(
                None,
                "link",
                "add",
                LINK,
                "netns",
                a,
                "type",
                "veth",
                "peer",
                "name",
                LINK,
                "netns",
                b,
            )
            for k in range(2):
                self._ip(k, "addr", "add", f"{self.addr(k)}/24", "dev", LINK)
                self._ip(k, "link", "set", LINK, "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _ip(self, k: int | None, *args: str) -> None:
        cmd = ["ip", *args] if k is None else self.enter(k) + ["ip", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        if out.returncode != 0:
            raise OSError(f"{' '.join(cmd)}: {out.stderr.strip()}")

    def enter(self, k: int) -> list[str]:
        """The command prefix that runs a program inside host k's namespaces, in the repository
        root (entering a mount namespace would move it to the namespace's root directory)."""
        return ["nsenter", "-t", str(self.hosts[k].pid), "-n", "-u", "-m", f"--wd={ROOT}", "--"]

    def drive(self, k: int, world: int, ranks: list[int], scenario: str, *extra: str):
        """Starts host k's driver for `ranks` of a world of `world`; returns its output file."""
        out = self.dir / f"result.{k}.json"
        env = dict(os.environ, GLOO_SOCKET_IFNAME=LINK)
        cmd = self.enter(k) + [
            sys.executable,
            "-m",
            "tests.helpers.hosts",
            "drive",
            "--world",
            str(world),
            "--ranks",
            ",".join(map(str, ranks)),
            "--addr",
            self.addr(0),
            "--scenario",
            scenario,
            "--out",
            str(out),
            *extra,
        ]
        log = open(self.dir / f"driver.{k}.log", "w")
        self.drivers.append(
            subprocess.Popen(cmd, env=env, start_new_session=True, stdout=log, stderr=log)
        )
        return out

    def wait(self, outs: list[Path], timeout: float) -> list[dict]:
        """Every driver's results (rank -> result), or AssertionError with the drivers' logs."""
        deadline = time.monotonic() + timeout
        for d in self.drivers:
            try:
                d.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        logs = "\n".join(
            f"--- driver {k} (exit {d.poll()}) ---\n" + (self.dir / f"driver.{k}.log").read_text()
            for k, d in enumerate(self.drivers)
        )
        if any(d.poll() != 0 for d in self.drivers) or not all(o.exists() for o in outs):
            raise AssertionError(f"the hosts' drivers failed or did not finish:\n{logs}")
        merged = {}
        for o in outs:
            merged.update({int(r): v for r, v in json.loads(o.read_text()).items()})
        return [merged[r] for r in sorted(merged)]

    def __exit__(self, *exc) -> None:
        for p in self.drivers + self.hosts:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(timeout=20)
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- the ranks' side --------------------------------------------------------------------------

#: (T, extra, n, H, sharded, norm) as boundaries.boundary_cases: none, one, fewer than the
#: ranks and more, sharded and replicated.
SPAN_CASES = [(T, 0, 4, 64, sharded, True) for T in (0, 1, 7, 33) for sharded in (True, False)]


def boundary_digests(rank: int, world: int, group: str) -> list[str]:
    """Every fused op and summing collective of SPAN_CASES on `group`, checked bit for bit
    against the single-device ops given reference.sum_partials; their outputs' digests."""
    import torch

    from tests.helpers.boundaries import check_rank_order_bitwise, digest, run_case

    out = []
    for case_id, case in enumerate(SPAN_CASES):
        got = run_case(rank, world, group, torch.device("cpu"), case_id, case, reference=False)
        check_rank_order_bitwise(rank, world, case, got, torch.device("cpu"))
        out.append(
            digest([*got["entry"], *got["layer"], *got["head"], got["all_reduce"]])
            + digest([got["reduce_scatter"]])
        )
    return out


def loop_until_error(step, limit_s: float) -> dict:
    calls = 0
    start = time.monotonic()
    try:
        while time.monotonic() - start < limit_s:
            step()
            calls += 1
    except Exception as e:  # noqa: BLE001  (reported)
        return {
            "raised_at": time.monotonic(),
            "type": type(e).__name__,
            "message": str(e).splitlines()[0],
            "calls": calls,
        }
    return {"raised_at": None, "type": None, "message": None, "calls": calls}


def cut_link_later(delay: float, report: dict) -> None:
    """From host 0 (rank 0): take the link down after `delay` seconds, noting when."""

    def cut():
        time.sleep(delay)
        report["cut_at"] = time.monotonic()
        subprocess.run(["ip", "link", "set", LINK, "down"], check=True)

    threading.Thread(target=cut, daemon=True).start()


def span_worker(rank: int, world: int, cut: bool) -> dict:
    """A TP group of every rank (on one host, or one rank per host): what init picks and why,
    the boundary digests, and (cut) how every rank fails once the link goes down."""
    import mhc_sp.distributed as msd

    report: dict = {}
    try:
        msd.init(device="cpu", transport="shm")
        report["shm_error"] = None
    except ValueError as e:
        report["shm_error"] = str(e)
    group = msd.init(device="cpu", transport="auto", timeout=COLLECTIVE_TIMEOUT_S)
    chosen = msd.transport(group, "cpu")
    report.update(transport=str(chosen), why=chosen.reason, hostname=os.uname().nodename)
    report["digests"] = boundary_digests(rank, world, group)
    if cut:
        from tests.helpers.faults import boundary

        layer, _ = boundary(group, rank, world, 16)
        layer()
        if rank == 0:
            cut_link_later(0.5, report)
        report.update(loop_until_error(layer, 60))
    return report


def tp_pp_worker(rank: int, world: int, cut: bool) -> dict:
    """tp=2 inside each host x pp=2 across them: the TP groups' transport, an SP forward of the
    small model against tp=1 on the last stage, and (cut) a serving loop whose sampled tokens go
    back to every rank (as an engine's next step needs them) until the link goes down."""
    import torch
    import torch.distributed as dist

    import mhc_sp.distributed as msd
    from mhc_sp.engine.config import ParallelConfig
    from mhc_sp.engine.model import RoutingTrace, TPContext
    from mhc_sp.engine.runner import (
        ModelRunner,
        ParallelGroups,
        init_parallel_groups,
        logits_tolerance,
    )
    from tests.helpers.engines import TINY, engine

    groups = init_parallel_groups(ParallelConfig(2, 2, 4), "cpu")
    chosen = msd.transport(groups.tp.group, "cpu")
    report = {"tp_transport": str(chosen), "why": chosen.reason, "pp_rank": groups.pp_rank}
    runner = ModelRunner(engine(2, sp=4, pp=2), groups)
    ids = torch.randint(0, TINY.vocab_size, (11,), generator=torch.Generator().manual_seed(5))
    trace = RoutingTrace()
    out = runner.forward(ids, routing=trace)
    report["sharded"] = out.plan.sharded
    stages = [None] * 2
    dist.all_gather_object(stages, [t.cpu() for t in trace.recorded], group=groups.pp_group)
    if runner.is_last_stage:
        one = ParallelGroups(TPContext(0, 1, groups.self_group), self_group=groups.self_group)
        recorded = [t for stage in stages for t in stage]
        ref = ModelRunner(engine(1), one).forward(ids, routing=RoutingTrace(recorded))
        report["max_diff"] = (out.logits - ref.logits).abs().max().item()
        report["tolerance"] = logits_tolerance(TINY.num_layers, ref.logits)
    if cut:
        last = (groups.pp_size - 1) * groups.tp.size

        def step():
            result = runner.forward(ids)
            tokens = result.logits.argmax(-1) if runner.is_last_stage else torch.empty_like(ids)
            dist.broadcast(tokens, src=last)

        step()
        if rank == 0:
            cut_link_later(0.5, report)
        report.update(loop_until_error(step, 60))
    return report


SCENARIOS = {"span": span_worker, "tp_pp": tp_pp_worker}


def drive(argv: list[str]) -> int:
    """The driver inside one host: runs its ranks, writes {rank: result} as JSON."""
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--ranks", required=True)
    p.add_argument("--addr", required=True)
    p.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    p.add_argument("--cut", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from mhc_sp.local_world import run_world

    ranks = [int(r) for r in args.ranks.split(",")]
    results = run_world(
        args.world,
        SCENARIOS[args.scenario],
        args.cut,
        ranks=ranks,
        addr=args.addr,
        port=PORT,
        collective_timeout=COLLECTIVE_TIMEOUT_S,
        timeout=240,
        start="forkserver",
    )
    Path(args.out).write_text(json.dumps(dict(zip(ranks, results))))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["drive"]:
        sys.exit(
            "usage: python -m tests.helpers.hosts drive --world N --ranks R,... --addr A"
            " --scenario S"
        )
    sys.exit(drive(sys.argv[2:]))
