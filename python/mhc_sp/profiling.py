# SPDX-License-Identifier: Apache-2.0
"""Named phases for profilers: an NVTX range (nsys) on CUDA builds and a ``record_function``
range (torch.profiler traces, CPU included), so Python phases line up with the C++ ops' ranges;
and :class:`PhaseTimer`, which also sums the wall time of each phase."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch


def _nvtx():
    try:
        if torch.cuda.is_available():
            return torch.cuda.nvtx
    except Exception:  # noqa: BLE001  (no CUDA runtime)
        pass
    return None


@contextlib.contextmanager
def phase(name: str):
    """``with phase("attention"): ...`` marks a region as ``mhc_sp/<name>``."""
    label = f"mhc_sp/{name}"
    nvtx = _nvtx()
    if nvtx is not None:
        nvtx.range_push(label)
    try:
        with torch.autograd.profiler.record_function(label):
            yield
    finally:
        if nvtx is not None:
            nvtx.range_pop()


@contextlib.contextmanager
def profiled(kind: str | None, trace_path: str = "mhc_sp_trace.json"):
    """Bracket a measured region for a profiler. ``"nsys"``: cudaProfilerStart/Stop, for
    ``nsys profile --capture-range=cudaProfilerApi``. ``"torch"``: a torch.profiler Chrome trace
    written to ``trace_path`` (CPU and CUDA). ``None``: nothing."""
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
    raise ValueError(f"profile: expected 'nsys' or 'torch', got {kind!r}")


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
