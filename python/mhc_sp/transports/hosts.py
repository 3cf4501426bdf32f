# SPDX-License-Identifier: Apache-2.0
"""Which ranks of a group share a host (:func:`mhc_sp.distributed.hosts`), the one test of a shared
host that the shm transport and the symm transport both read.

Two ranks share a host when they run on the same kernel boot (its boot id), in the same PID
namespace (the shm transport watches its peers' process ids) and each reads a shared-memory
segment that the other has just created with a random name and content (so they share
``/dev/shm``). The hostname is not used: containers and network namespaces give one machine
several names, and separate machines can have the same one.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Sequence

import torch.distributed as dist
from torch.distributed import ProcessGroup

#: Where POSIX shared-memory names live on Linux (shm_open("/x") is this directory's "x").
_SHM_DIR = "/dev/shm"

#: What :func:`describe` says of a group whose ranks all share rank 0's host.
ONE_HOST = (
    "every rank is on rank 0's host (one kernel boot and PID namespace, and each rank found a "
    "shared-memory segment of every other)"
)


def _host_facts() -> dict:
    """This process's side of :func:`hosts`: its kernel boot, its PID namespace, and a fresh
    shared-memory probe (a private segment with a random name and random content), or None where
    a fact cannot be had (then no other rank is taken to share the host)."""
    facts = {"hostname": socket.gethostname(), "boot": None, "pid_ns": None, "probe": None}
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            facts["boot"] = f.read().strip()
        st = os.stat("/proc/self/ns/pid")
        facts["pid_ns"] = (st.st_dev, st.st_ino)
    except OSError:
        pass
    name, token = f"mhc_sp_probe_{secrets.token_hex(16)}", secrets.token_hex(16)
    try:
        fd = os.open(os.path.join(_SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        facts["probe"] = (name, token)
    except OSError:
        pass
    return facts


def _reads_probe(probe) -> bool:
    """Whether this process opens the shared-memory segment `probe` and finds its content."""
    if probe is None:
        return False
    try:
        with open(os.path.join(_SHM_DIR, probe[0])) as f:
            return f.read() == probe[1]
    except OSError:
        return False


def hosts(pg: ProcessGroup) -> tuple[list[int], list[str]]:
    """``(host, why)`` of the ranks of ``pg``; collective over the group. ``host[r]`` numbers rank
    r's host (rank 0's is 0, the others in the order their first rank appears) and ``why[r]`` says
    why rank r is not on rank 0's host ("" when it is)."""
    world = pg.size()
    mine = _host_facts()
    try:
        facts = [None] * world
        dist.all_gather_object(facts, mine, group=pg)
        reads = [None] * world  # reads[a][b]: rank a read rank b's probe
        dist.all_gather_object(reads, [_reads_probe(f["probe"]) for f in facts], group=pg)
    finally:
        if mine["probe"] is not None:
            try:
                os.unlink(os.path.join(_SHM_DIR, mine["probe"][0]))
            except OSError:
                pass

    def differs(a: int, b: int) -> str:
        """Why ranks a and b are not on one host ("" when they are)."""
        fa, fb = facts[a], facts[b]
        if fa["boot"] is None or fa["boot"] != fb["boot"]:
            return "another kernel boot id"
        if fa["pid_ns"] is None or fa["pid_ns"] != fb["pid_ns"]:
            return "another PID namespace"
        if not (reads[a][b] and reads[b][a]):
            return (
                f"no shared memory with rank {a} (a segment made by one is not found by the other)"
            )
        return ""

    host, firsts = [], []
    for r in range(world):
        same = [k for k, first in enumerate(firsts) if not differs(first, r)]
        if same:
            host.append(same[0])
        else:
            host.append(len(firsts))
            firsts.append(r)
    why = [differs(0, r) if host[r] != 0 else "" for r in range(world)]
    return host, why


def describe(host: Sequence[int], why: Sequence[str]) -> tuple[list[int], str, str]:
    """``(elsewhere, fact, detail)`` of :func:`hosts`' answer: the ranks not on rank 0's host,
    one sentence on where the ranks run (:data:`ONE_HOST` when all on rank 0's), and why each
    rank elsewhere is ("" when none is)."""
    elsewhere = [r for r in range(len(host)) if host[r] != 0]
    detail = "; ".join(f"rank {r}: {why[r]}" for r in elsewhere)
    if not elsewhere:
        return elsewhere, ONE_HOST, detail
    return elsewhere, f"ranks {elsewhere} are not on rank 0's host ({detail})", detail
