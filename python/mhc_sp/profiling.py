# SPDX-License-Identifier: Apache-2.0
"""Profiler ranges and hooks.

* :func:`phase`: a named Python phase, ``mhc_sp/<name>``, as an NVTX range in the ops' own
  ``mhc_sp`` domain (nsys; nested with the C++ ops' ``mhc_sp::<op>`` ranges) and as a
  ``record_function`` range (torch.profiler traces, CPU included); :class:`PhaseTimer` also sums
  the wall time of each phase.
* :func:`profiled`: brackets a measured region for one of :data:`PROFILERS`.
* The recording NVTX tool (``tools/nvtx_record``, built beside the extension): what nsys would
  record, without nsys. :func:`use_nvtx_recorder` attaches it, :func:`read_nvtx_events`,
  :func:`nvtx_ranges` and :func:`summarize_ranges` read what it recorded.

docs/profiling-nvtx.md describes the ranges; :data:`FUSED_PHASES` and :data:`MODEL_PHASE_OPS`
are the tables it shows (tests/cli/test_nvtx.py keeps the two in step and checks them against
real recordings).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import _C

#: The kinds :func:`profiled` takes (``mhc-sp-bench --profile``).
PROFILERS = ("nsys", "torch", "nvtx-record")

#: The child ranges ``mhc_sp::<op>/<phase>`` of each fused op's ``mhc_sp::<op>`` range, in the
#: order they run, for the two ways an op runs: "shm", the CPU shared-memory transport's one-pass
#: boundary, and "composed", the op built from collectives and math ops (gloo, NCCL, and the symm
#: transport for the calls its kernels do not take). ``gather`` runs only when the stream is
#: sharded over more than one rank. The symm transport's one-kernel fused_layer has no children.
FUSED_PHASES: dict[str, dict[str, tuple[str, ...]]] = {
    "fused_entry": {"shm": ("pre", "gather"), "composed": ("pre", "gather")},
    "fused_layer": {
        "shm": ("exchange", "post_pre", "gather"),
        "composed": ("reduce", "post_pre", "gather"),
    },
    "fused_head": {
        "shm": ("exchange", "post_head", "gather"),
        "composed": ("reduce", "post_head", "gather"),
    },
}

#: The model's Python phases (``mhc_sp/<phase>``) and the mhc_sp ops that run directly inside each
#: (an op's innermost enclosing phase is one of these; no op of a model forward runs outside
#: them). ``mtp`` is one MTP draft step (``ModelRunner.propose``): its layer's phases nest in it.
MODEL_PHASE_OPS: dict[str, tuple[str, ...]] = {
    "embed": ("all_reduce", "shard_tokens"),
    "boundary": (
        "fused_entry",
        "fused_layer",
        "fused_head",
        "mhc_post_pre",
        "mhc_pre",
        "shard_tokens",
        "all_gather",
        "reduce_scatter",
        "all_reduce",
    ),
    "attention": (),
    "moe": ("all_reduce", "all_gather", "reduce_scatter"),
    "lm_head": ("all_gather",),
    "mtp": (),
    "pp_recv": (),
    "pp_send": (),
}

#: Environment variables of the recording NVTX tool: NVTX loads the library that the first names
#: at its first call; the tool writes its events at exit to the file the second names ("%p": the
#: process id).
NVTX_INJECTION_VAR = "NVTX_INJECTION64_PATH"
NVTX_RECORD_VAR = "MHC_SP_NVTX_RECORD"


@contextlib.contextmanager
def phase(name: str):
    """``with phase("attention"): ...`` marks a region as ``mhc_sp/<name>``."""
    label = f"mhc_sp/{name}"
    _C.nvtx_push(label)
    try:
        with torch.autograd.profiler.record_function(label):
            yield
    finally:
        _C.nvtx_pop()


@contextlib.contextmanager
def profiled(kind: str | None, trace_path: str = "mhc_sp_trace.json"):
    """Bracket a measured region for a profiler. ``"nsys"``: cudaProfilerStart/Stop, for
    ``nsys profile --capture-range=cudaProfilerApi``. ``"torch"``: a torch.profiler Chrome trace
    written to ``trace_path`` (CPU and CUDA). ``"nvtx-record"``: a JSON summary per NVTX range of
    the region (count, total and mean time, see :func:`summarize_ranges`) written to
    ``trace_path``; the process must run under the recording NVTX tool (:func:`use_nvtx_recorder`
    before the first mhc_sp op). ``None``: nothing."""
    if kind is None:
        yield
        return
    if kind == "nsys":
        if not torch.cuda.is_available():
            raise ValueError("--profile nsys needs a CUDA device (use --profile torch on CPU)")
        torch.cuda.profiler.start()
        try:
            yield
        finally:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        return
    if kind == "torch":
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
            yield
        prof.export_chrome_trace(trace_path)
        return
    if kind == "nvtx-record":
        with _nvtx_recorded(trace_path):
            yield
        return
    raise ValueError(f"profile: expected one of {', '.join(PROFILERS)}, got {kind!r}")


# ---- the recording NVTX tool -------------------------------------------------------------------


def nvtx_recorder_library() -> Path:
    """The recording NVTX tool's shared library, built beside the extension. Raises ValueError
    (saying why) when this build has none: it is built with the NVTX ranges, when the NVTX v3
    headers were found (``build_info()["nvtx"]``)."""
    if not _C.build_info()["nvtx"]:
        raise ValueError(
            "profile: nvtx-record needs mhc_sp built with NVTX ranges, and this build has none "
            "(no NVTX v3 headers were found, or MHC_SP_NVTX=0; pip install nvidia-nvtx, rebuild)"
        )
    library = Path(_C.__file__).with_name("libmhc_sp_nvtx_record.so")
    if not library.is_file():
        raise ValueError(f"profile: nvtx-record: the recording NVTX tool {library} is missing")
    return library


def use_nvtx_recorder(record: str | None = None) -> None:
    """Run this process, and every process it starts from now on, under the recording NVTX tool;
    with ``record``, each process writes all its events at exit to that path (``%p``: the process
    id). NVTX looks for a tool once, at its first call, so call this before the first mhc_sp op or
    :func:`phase` of the process (``mhc-sp-bench --profile nvtx-record`` does, first thing)."""
    library = str(nvtx_recorder_library())
    current = os.environ.get(NVTX_INJECTION_VAR)
    if current and Path(current).resolve() != Path(library).resolve():
        raise ValueError(
            f"profile: nvtx-record: {NVTX_INJECTION_VAR} already names another NVTX tool "
            f"({current})"
        )
    os.environ[NVTX_INJECTION_VAR] = library
    if record is not None:
        os.environ[NVTX_RECORD_VAR] = record


def _loaded_recorder() -> ctypes.CDLL:
    """The recording tool as loaded by NVTX in this process (never loads it: NVTX must have)."""
    library = nvtx_recorder_library()
    try:
        recorder = ctypes.CDLL(str(library), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        recorder = None
    if recorder is None or recorder.mhc_sp_nvtx_record_attached() < 1:
        raise ValueError(
            f"profile: nvtx-record: the recording NVTX tool is not attached to this process; "
            f"start it with {NVTX_INJECTION_VAR}={library} (mhc-sp-bench does), or call "
            f"mhc_sp.profiling.use_nvtx_recorder() before the first mhc_sp op"
        )
    recorder.mhc_sp_nvtx_record_count.restype = ctypes.c_uint64
    recorder.mhc_sp_nvtx_record_write.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64]
    return recorder


@contextlib.contextmanager
def _nvtx_recorded(summary_path: str):
    # The region is itself a range, mhc_sp/profile: opening it is also this process's first NVTX
    # call when nothing ran before, the moment NVTX attaches the tool.
    _C.nvtx_push("mhc_sp/profile")
    try:
        recorder = _loaded_recorder()
    except ValueError:
        _C.nvtx_pop()
        raise
    first = recorder.mhc_sp_nvtx_record_count() - 1  # the profile range's push
    try:
        yield
    finally:
        _C.nvtx_pop()
        last = recorder.mhc_sp_nvtx_record_count()
        with tempfile.TemporaryDirectory() as folder:
            events_path = os.path.join(folder, "events.jsonl")
            if recorder.mhc_sp_nvtx_record_write(events_path.encode(), first, last) != 0:
                raise OSError(f"nvtx-record: could not write {events_path}")
            events = read_nvtx_events(events_path)
        summary = summarize_ranges(nvtx_ranges(events))
        Path(summary_path).write_text(json.dumps(summary, indent=1) + "\n")


def read_nvtx_events(path: str | os.PathLike) -> list[dict]:
    """The events the recording tool wrote (JSON lines, in the order they happened): ``kind``
    ("domain", "push", "pop", "mark"), ``tid``, ``ns`` (CLOCK_MONOTONIC), ``domain`` ("" for
    NVTX's default domain) and ``message`` (None for a pop)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass(frozen=True)
class NvtxRange:
    """One pushed-and-popped NVTX range. ``parent``: the index (in :func:`nvtx_ranges`' list) of
    the range it nests in on its thread and domain, or None; ``depth``: how many enclose it."""

    name: str
    domain: str
    tid: int
    start_ns: int
    end_ns: int
    depth: int
    parent: int | None

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9


@dataclass
class NvtxRanges:
    """:func:`nvtx_ranges`' result: the ranges, ordered by their push; the pops that closed no
    range; the pushes never popped."""

    ranges: list[NvtxRange]
    unmatched_pops: list[dict]
    unclosed: list[dict]


def nvtx_ranges(events: list[dict]) -> NvtxRanges:
    """Pair each pop with the latest open push of its thread and domain (NVTX's push/pop stacks
    are per thread and per domain)."""
    slots: list[NvtxRange | None] = []
    stacks: dict[tuple[int, str], list[tuple[int, dict]]] = {}
    unmatched = []
    for e in events:
        key = (e["tid"], e["domain"])
        if e["kind"] == "push":
            stack = stacks.setdefault(key, [])
            stack.append((len(slots), e))
            slots.append(None)
        elif e["kind"] == "pop":
            stack = stacks.get(key)
            if not stack:
                unmatched.append(e)
                continue
            index, push = stack.pop()
            parent = stack[-1][0] if stack else None
            slots[index] = NvtxRange(
                push["message"], e["domain"], e["tid"], push["ns"], e["ns"], len(stack), parent
            )
    unclosed = [push for stack in stacks.values() for _, push in stack]
    open_slots = {index for stack in stacks.values() for index, _ in stack}
    # Renumber parents past the unclosed pushes' empty slots.
    kept = [i for i in range(len(slots)) if i not in open_slots]
    renumber = {old: new for new, old in enumerate(kept)}
    ranges = [
        NvtxRange(
            r.name,
            r.domain,
            r.tid,
            r.start_ns,
            r.end_ns,
            r.depth,
            renumber.get(r.parent) if r.parent is not None else None,
        )
        for r in (slots[i] for i in kept)
    ]
    return NvtxRanges(ranges, unmatched, unclosed)


def summarize_ranges(recorded: NvtxRanges) -> dict:
    """Per range name (and domain): count, total and mean time, the largest total first: what
    ``nsys stats --report nvtx_sum`` shows. Also the count of unclosed ranges and unmatched pops
    (zero in a sound recording)."""
    rows: dict[tuple[str, str], list[float]] = {}
    for r in recorded.ranges:
        rows.setdefault((r.domain, r.name), []).append(r.seconds)
    table = [
        {
            "range": name,
            "domain": domain,
            "count": len(times),
            "total_us": round(sum(times) * 1e6, 3),
            "mean_us": round(sum(times) / len(times) * 1e6, 3),
            "min_us": round(min(times) * 1e6, 3),
            "max_us": round(max(times) * 1e6, 3),
        }
        for (domain, name), times in rows.items()
    ]
    table.sort(key=lambda row: -row["total_us"])
    return {
        "kind": "nvtx-record",
        "ranges": table,
        "unclosed_ranges": len(recorded.unclosed),
        "unmatched_pops": len(recorded.unmatched_pops),
    }


@dataclass
class PhaseTimer:
    """Wall time per named phase, summed over calls. On CUDA it synchronises at each phase edge
    (so the numbers are real, at the cost of overlap); never use it inside graph capture."""

    sync_cuda: bool = False
    totals: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str):
        if self.sync_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            with phase(name):
                yield
        finally:
            if self.sync_cuda:
                torch.cuda.synchronize()
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start
            self.counts[name] = self.counts.get(name, 0) + 1

    def reset(self) -> None:
        """Forget every recorded phase."""
        self.totals.clear()
        self.counts.clear()


class NullTimer:
    """A timer that records no time (the default; safe under CUDA graph capture); the phase still
    shows in profilers (NVTX / torch.profiler ranges)."""

    @contextlib.contextmanager
    def phase(self, name: str):
        with phase(name):
            yield


NULL_TIMER = NullTimer()
