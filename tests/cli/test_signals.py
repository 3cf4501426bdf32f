# SPDX-License-Identifier: Apache-2.0
"""Ranks never outlive mhc-sp-bench: whatever ends the command (SIGINT, SIGTERM or SIGKILL, to
it alone or to its process group), every rank it started is gone within 2 s of the signal and
leaves nothing behind: no shared-memory segment of its transport, no listening store port, no
process (the multiprocessing helper included, a little later). SIGINT and SIGTERM end the run
with one line and exit status 128 + the signal.

Each case starts a real command on 2 CPU ranks (small sizes, rounds enough to run for minutes)
and signals it once its ranks have set up their transport. One case per signal runs by default;
the other commands and the group variants are in the slow set."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.distributed

SMALL = ["-tp", "2", "--tokens", "8", "--repeats", "10000", "--device", "cpu"]
COMMANDS = {
    "tune": ["tune", "--hidden-size", "64", *SMALL],
    "layer": ["layer", "--hidden-size", "64", *SMALL],
    "model": ["model", *SMALL],
}
#: How soon after the signal every rank must be gone.
RANKS_GONE_S = 2.0
DEFAULT = {
    ("tune", "SIGINT", "alone"),
    ("layer", "SIGTERM", "group"),
    ("model", "SIGKILL", "alone"),
}


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(name)] = (int(fields[1]), fields[0])
    return out


def descendants(pid: int) -> list[int]:
    table, found, todo = processes(), [], [pid]
    while todo:
        pid = todo.pop()
        children = [p for p, (parent, _) in table.items() if parent == pid]
        found += children
        todo += children
    return found


def running(pids) -> list[int]:
    table = processes()
    return [p for p in pids if p in table and table[p][1] != "Z"]


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def segments(pids) -> set[str]:
    """The mhc_sp shared-memory segments the processes map."""
    names = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    if "/dev/shm/mhc_sp_" in line:
                        names.add(line.split("/dev/shm/")[1].split()[0])
        except OSError:
            pass
    return names


def listening_ports(pids=None) -> set[int]:
    """TCP ports in LISTEN state: all of them, or those whose socket one of ``pids`` holds."""
    inodes = None
    if pids is not None:
        inodes = set()
        for pid in pids:
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
            except OSError:
                pass
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and (inodes is None or fields[9] in inodes):
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def ranks_of(main: int) -> list[int]:
    return [p for p in descendants(main) if "spawn_main" in cmdline(p)]


CASES = [
    pytest.param(
        command,
        sig,
        to,
        marks=() if (command, sig, to) in DEFAULT else pytest.mark.slow,
        id=f"{command}-{sig}-{to}",
    )
    for command in COMMANDS
    for sig in ("SIGINT", "SIGTERM", "SIGKILL")
    for to in ("alone", "group")
]


@pytest.mark.parametrize("command,sig,to", CASES)
def test_no_rank_outlives_the_command(command, sig, to):
    proc = subprocess.Popen(
        [sys.executable, "-m", "mhc_sp.bench", *COMMANDS[command]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, which the group variant signals
        # Started as a shell starts a background job: SIGINT ignored. The command must still stop.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # until both ranks have their transport (they are measuring)
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the ranks did not start"
            ranks = ranks_of(proc.pid)
            if len(ranks) == 2 and len(segments(ranks)) >= 1:
                break
            time.sleep(0.1)
        everything = descendants(proc.pid)
        used, ports = segments(ranks), listening_ports(ranks)
        assert ports, "the store of rank 0 listens"
        number = getattr(signal, sig)
        sent = time.monotonic()
        if to == "group":
            os.killpg(proc.pid, number)
        else:
            os.kill(proc.pid, number)
        while running(ranks) and time.monotonic() - sent < 10:
            time.sleep(0.02)
        gone_after = time.monotonic() - sent
        err = proc.communicate(timeout=30)[1]  # reading stderr meanwhile: a full pipe would block
        code = proc.returncode
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert gone_after <= RANKS_GONE_S, (gone_after, err)
    deadline = time.monotonic() + 10  # the multiprocessing helper ends when its pipe closes
    while running(everything) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(everything) == []
    assert [s for s in used if os.path.exists(f"/dev/shm/{s}")] == []
    assert not ports & listening_ports()
    if sig == "SIGKILL":
        assert code == -signal.SIGKILL
    else:
        assert code == 128 + number, err
        assert err.strip().splitlines()[-1] == (
            f"mhc-sp-bench: stopped by {sig}; every rank it started has exited"
        )
        assert "Traceback" not in err, err
