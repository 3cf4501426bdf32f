# SPDX-License-Identifier: Apache-2.0
"""The CPU allocator every measurement runs with, decided in one place.

The ops return fresh tensors, and glibc's ``malloc`` maps each allocation of 32 MiB and more
afresh and unmaps it on free, so every prefill-sized call page-faults and zero-fills its output
(a 2-rank ``fused_layer`` at 4096 tokens took about twice as long that way). ``TUNABLES`` keeps
freed memory in the heap for reuse instead. glibc reads ``GLIBC_TUNABLES`` once, when a process
starts, so :func:`apply` sets it in the environment, where spawned ranks inherit it, and restarts
this process once when it measures in this process itself. A preloaded jemalloc, tcmalloc or
mimalloc, or a ``GLIBC_TUNABLES`` the user set, is left as it is."""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping, Optional

TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")
#: Set in the restarted process, so that it never restarts again.
RESTARTED = "MHC_SP_BENCH_RESTARTED"


def _is_glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def describe(env: Optional[Mapping[str, str]] = None) -> str:
    """Which allocator a process started with ``env`` (default: this one's) uses."""
    env = os.environ if env is None else env
    preload = env.get("LD_PRELOAD", "")
    for name in PRELOADED:
        if name in preload:
            return f"{name} (LD_PRELOAD={preload})"
    if not _is_glibc():
        return "the C library's malloc (not glibc; no tunables applied)"
    given = env.get("GLIBC_TUNABLES")
    if given == TUNABLES:
        return f"glibc malloc, freed memory kept for reuse (GLIBC_TUNABLES={TUNABLES})"
    if given:
        return f"glibc malloc with GLIBC_TUNABLES={given}"
    return "glibc malloc, default settings (large outputs mapped afresh on every call)"


def _wanted() -> bool:
    """Whether this environment still lacks the setting (and can take it)."""
    preload = os.environ.get("LD_PRELOAD", "")
    return (
        _is_glibc()
        and "GLIBC_TUNABLES" not in os.environ
        and not any(name in preload for name in PRELOADED)
    )


#: What the last :func:`apply` found in use for the measurements (the JSON files record it).
IN_USE: Optional[str] = None


def apply(measures_here: bool, from_command_line: bool) -> str:
    """Give every measurement of this command the allocator setting, and say which allocator is
    in use (one line for stderr). Spawned ranks inherit the environment set here. A command that
    ``measures_here`` (in this process), started from the command line, is restarted once with
    the setting; called from Python instead, this process keeps the allocator it started with
    and the line says so."""
    global IN_USE
    if not _wanted():
        IN_USE = describe()
        return f"allocator: {IN_USE}"
    os.environ["GLIBC_TUNABLES"] = TUNABLES  # read by every process started from now on
    if measures_here and from_command_line and RESTARTED not in os.environ:
        os.environ[RESTARTED] = "1"
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "mhc_sp.bench", *sys.argv[1:]])
    if measures_here and not from_command_line:
        IN_USE = describe({})
        return f"allocator: {IN_USE} in this process (started without the setting)"
    IN_USE = describe()
    return f"allocator: {IN_USE}"
