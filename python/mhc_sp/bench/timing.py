# SPDX-License-Identifier: Apache-2.0
"""Timing for the benchmark CLI: one way to time a callable on CPU or CUDA, and the machine's copy
bandwidth measured in the same run (the yardstick for bandwidth-bound ops)."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch


@dataclass
class Timing:
    """Seconds per call over `repeats` timed samples; ``graph``: replays of a CUDA graph."""

    median: float
    p10: float
    p90: float
    repeats: int
    graph: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def _summarise(samples: list[float]) -> Timing:
    samples = sorted(samples)
    pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
    return Timing(statistics.median(samples), pick(0.1), pick(0.9), len(samples))


def time_call(
    fn: Callable[[], object],
    device: torch.device,
    warmup: int = 3,
    repeats: int = 20,
    cuda_graph: bool = False,
) -> Timing:
    """Median/spread of one call of ``fn()``. CPU: ``perf_counter`` around each call. CUDA: see
    :func:`_time_cuda`."""
    if device.type == "cuda":
        return _time_cuda(fn, device, warmup, repeats, cuda_graph)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return _summarise(samples)


#: Calls captured into one CUDA graph, and the least time one CUDA sample spans.
CALLS_PER_GRAPH = 10
CUDA_SAMPLE_S = 1e-3


def _time_cuda(fn, device, warmup, repeats, cuda_graph) -> Timing:
    """CUDA events around a back-to-back run of calls, enough of them that a sample spans about
    ``CUDA_SAMPLE_S`` (so event resolution and host jitter do not count); the sample is divided
    by the number of calls. With ``cuda_graph`` the calls are replays of a graph holding
    ``CALLS_PER_GRAPH`` calls of ``fn``: launch overhead is excluded, as in an engine replaying
    captured decode steps."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    run, calls = fn, 1
    if cuda_graph:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            fn()  # warms the allocator on the capture stream
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(CALLS_PER_GRAPH):
                    fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        run, calls = graph.replay, CALLS_PER_GRAPH
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end) / 1e3, 1e-7)
    inner = max(1, min(1000, math.ceil(CUDA_SAMPLE_S / once)))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(repeats)
    ]
    for start, end in events:
        start.record()
        for _ in range(inner):
            run()
        end.record()
    torch.cuda.synchronize(device)
    timing = _summarise([s.elapsed_time(e) / 1e3 / (inner * calls) for s, e in events])
    timing.graph = cuda_graph
    return timing


def copy_call(nbytes: int, device: torch.device) -> Callable[[], object]:
    """An out-of-place copy of ``nbytes / 2`` bytes into a fresh output, like the ops allocate: the
    same bytes moved (read + write) as an op that reads and writes ``nbytes`` in total. Timed
    beside the op (``time_calls``), it sees the same cache and machine state as the op."""
    src = torch.empty(max(1, nbytes // 2), dtype=torch.uint8, device=device)
    return lambda: torch.empty_like(src).copy_(src)


def time_across_ranks(
    fn: Callable[[], object], device: torch.device, warmup: int, repeats: int
) -> float:
    """Median seconds of ``fn()`` on this rank, every call started together (a barrier first) and
    finished on the device before the clock stops. Called by every rank of the world."""
    import torch.distributed as dist

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        dist.barrier()
        sync()
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def rank_device(device_type: str) -> torch.device:
    """This rank's device: its current CUDA device, or the CPU."""
    return (
        torch.device("cuda", torch.cuda.current_device())
        if device_type == "cuda"
        else torch.device("cpu")
    )


def time_calls(
    fns: dict, device: torch.device, warmup: int = 3, repeats: int = 20, cuda_graph: bool = False
) -> dict:
    """``time_call`` for several callables that are compared with each other. On CPU the timed
    calls come in rounds (a a a, b b b, c c c, a a a, ...), each burst after one untimed call, so
    that neither drift of a shared machine nor the cache state another callable left behind
    biases the comparison. On CUDA each callable is timed in turn; one that cannot be captured
    into a graph (when ``cuda_graph``) is timed eagerly, and its Timing says so."""
    if device.type == "cuda":
        out = {}
        for name, fn in fns.items():
            try:
                out[name] = time_call(fn, device, warmup, repeats, cuda_graph)
            except Exception:  # noqa: BLE001  (e.g. a compiled baseline that cannot be captured)
                if not cuda_graph:
                    raise
                torch.cuda.synchronize(device)
                out[name] = time_call(fn, device, warmup, repeats, cuda_graph=False)
        return out
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    rounds = max(1, min(5, repeats))
    per_round = -(-repeats // rounds)
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()
            for _ in range(per_round):
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
    return {name: _summarise(s) for name, s in samples.items()}
