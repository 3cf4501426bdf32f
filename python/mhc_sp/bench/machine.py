# SPDX-License-Identifier: Apache-2.0
"""What this machine offers the benchmarks, probed in one place each: GPUs, the cores this
process may use, available memory, the CPU's model name; and the warnings that follow from them
(more ranks x threads than cores, a machine already busy)."""

from __future__ import annotations

import os
import sys
from typing import Optional


def gpu_count() -> int:
    """The CUDA devices this process can use (0 without CUDA): the one probe every device choice
    and check reads."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_memory() -> Optional[int]:
    """Bytes of memory available to new work (Linux ``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def threads_per_rank(ranks: int, threads: Optional[int]) -> int:
    """``--threads``, or this machine's cores shared out over ``ranks`` (at least one)."""
    return threads or max(1, available_cores() // ranks)


def warn_oversubscribed(prog: str, ranks: int, threads: int) -> None:
    """One line on stderr when ranks x threads exceed the cores: ranks then wait for each
    other's time slices, and the times measure the contention."""
    cores = available_cores()
    if ranks * threads > cores:
        print(
            f"{prog}: warning: {ranks} ranks x {threads} thread(s) = {ranks * threads} > "
            f"{cores} cores: the ranks take turns on the cores, so times include that wait",
            file=sys.stderr,
        )


def warn_busy(prog: str) -> None:
    """One line on stderr when other work already keeps this machine's cores busy: the times
    then include waiting for a core (a rank, or a thread of a parallel op, that is switched
    out holds up the others)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available here
        return
    cores = available_cores()
    if load > cores:
        print(
            f"{prog}: warning: this machine is busy (load average {load:.1f} on {cores} cores): "
            f"times include waiting for a core; compare runs made alike",
            file=sys.stderr,
        )


def cpu_model() -> Optional[str]:
    """The CPU's model name, as lscpu shows it (``/proc/cpuinfo``; None where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
