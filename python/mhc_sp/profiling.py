"""Named phases for profilers: an NVTX range (nsys) on CUDA builds and a ``record_function``
range (torch.profiler traces, CPU included), so Python phases line up with the C++ ops' ranges."""

from __future__ import annotations

import contextlib

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
