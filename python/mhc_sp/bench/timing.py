"""Timing for the benchmark CLI: one way to time a callable on CPU or CUDA, and the machine's copy
bandwidth measured in the same run (the yardstick for bandwidth-bound ops)."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch


@dataclass
class Timing:
    """Seconds per call over `repeats` timed calls."""

    median: float
    p10: float
    p90: float
    repeats: int

    def as_dict(self) -> dict:
        return asdict(self)


def _summarise(samples: list[float]) -> Timing:
    samples = sorted(samples)
    pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
    return Timing(statistics.median(samples), pick(0.1), pick(0.9), len(samples))


def time_call(fn: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 20,
              cuda_graph: bool = False) -> Timing:
    """Median/spread of ``fn()``. CPU: perf_counter per call. CUDA: CUDA events around each call,
    or around replays of a CUDA graph of ``fn`` when ``cuda_graph`` (launch overhead excluded,
    as an engine running captured decode steps sees it)."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return _summarise(samples)

    torch.cuda.synchronize(device)
    run = fn
    if cuda_graph:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            fn()  # warm allocator on the capture stream
            with torch.cuda.graph(graph, stream=stream):
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        run = graph.replay
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]
    for start, end in events:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize(device)
    return _summarise([start.elapsed_time(end) / 1e3 for start, end in events])


def copy_call(nbytes: int, device: torch.device) -> Callable[[], object]:
    """An out-of-place copy of ``nbytes / 2`` bytes into a fresh output, like the ops allocate: the
    same bytes moved (read + write) as an op that reads and writes ``nbytes`` in total. Timed
    beside the op (``time_calls``), it sees the same cache and machine state as the op."""
    src = torch.empty(max(1, nbytes // 2), dtype=torch.uint8, device=device)
    return lambda: torch.empty_like(src).copy_(src)


def time_across_ranks(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
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
    return torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")


def time_calls(fns: dict, device: torch.device, warmup: int = 3, repeats: int = 20,
               cuda_graph: bool = False) -> dict:
    """``time_call`` for several callables that are compared with each other. On CPU the timed
    calls come in rounds (a a a, b b b, c c c, a a a, ...), each burst after one untimed call, so
    that neither drift of a shared machine nor the cache state another callable left behind
    biases the comparison; CUDA events are taken per callable."""
    if device.type == "cuda":
        return {name: time_call(fn, device, warmup, repeats, cuda_graph) for name, fn in fns.items()}
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
