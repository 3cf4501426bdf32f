# SPDX-License-Identifier: Apache-2.0
"""Ranks on hosts that are really separate (tests/helpers/hosts.py: namespaces of their
own, a private /dev/shm, a veth pair between them). A tp=2 group across two hosts gets gloo from
transport="auto", gives bitwise the results of one host, and says why; tp=2 inside each host x
pp=2 across them runs shm inside the TP groups and hands the pipeline over between the hosts;
once the link goes down every rank raises within the timeout. Same host is decided by
mhc_sp.distributed.hosts (boot id, PID namespace, a shared-memory probe), not the hostname.
Needs root; skips with the reason otherwise."""

import ctypes
import os
import socket

import pytest

from mhc_sp.local_world import run_world
from tests.helpers import hosts as H

pytestmark = pytest.mark.distributed

#: Seconds past the gloo timeout within which every rank must have raised once the link is down.
GRACE_S = 3.0


@pytest.fixture
def hosts():
    why = H.unavailable()
    if why:
        pytest.skip(why)
    h = H.Hosts()
    try:
        h.__enter__()
    except OSError as e:
        pytest.skip(f"cannot make separate hosts here: {e}")
    yield h
    h.__exit__(None, None, None)


def check_cut(results):
    """Every rank raised within the timeout of the link going down."""
    cut_at = results[0]["cut_at"]
    for rank, r in enumerate(results):
        assert r["type"] is not None, f"rank {rank} never raised: {r}"
        assert r["raised_at"] - cut_at < H.COLLECTIVE_TIMEOUT_S + GRACE_S, (rank, r)


def test_tp2_across_two_hosts(hosts):
    outs = [hosts.drive(k, 2, [k], "span", "--cut") for k in range(2)]
    results = hosts.wait(outs, timeout=240)
    assert results[0]["hostname"] != results[1]["hostname"]
    for r in results:
        assert r["transport"] == "gloo", r
        assert "ranks [1] are not on rank 0's host" in r["why"], r["why"]
        assert "no shared memory with rank 0" in r["why"], r["why"]
        assert r["shm_error"].startswith("transport: 'shm' needs every rank"), r["shm_error"]
    one_host = run_world(2, H.span_worker, False, start="forkserver")
    assert [r["transport"] for r in one_host] == ["shm", "shm"]
    assert "every rank is on rank 0's host" in one_host[0]["why"]
    assert [r["digests"] for r in results] == [r["digests"] for r in one_host]
    check_cut(results)


@pytest.mark.slow
def test_tp2_in_each_host_pp2_across(hosts):
    outs = [hosts.drive(k, 4, [2 * k, 2 * k + 1], "tp_pp", "--cut") for k in range(2)]
    results = hosts.wait(outs, timeout=400)
    for r in results:
        assert r["tp_transport"] == "shm", r
        assert "every rank is on rank 0's host" in r["why"], r["why"]
        assert r["sharded"]
    for r in results[2:]:  # the last stage's logits against tp=1
        assert r["max_diff"] <= r["tolerance"], r
    check_cut(results)


def renamed_host_worker(rank, world):
    """Rank 1 takes a UTS namespace and a hostname of its own, nothing else."""
    import mhc_sp.distributed as msd

    if rank == 1:
        libc = ctypes.CDLL(None, use_errno=True)
        name = b"mhc-sp-renamed"
        if libc.unshare(0x04000000) != 0 or libc.sethostname(name, len(name)) != 0:  # CLONE_NEWUTS
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUTS)")
    group = msd.init(device="cpu", transport="auto")
    host, _ = msd.hosts()
    return socket.gethostname(), str(msd.transport(group, "cpu")), host


def test_another_hostname_alone_is_the_same_host():
    if os.geteuid() != 0:
        pytest.skip("a UTS namespace of its own needs root")
    results = run_world(2, renamed_host_worker, start="forkserver")
    assert results[0][0] != results[1][0]
    assert [r[1:] for r in results] == [("shm", [0, 0])] * 2
