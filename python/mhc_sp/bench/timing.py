# SPDX-License-Identifier: Apache-2.0
"""Timing for the benchmark CLI: one way to time a callable on CPU or CUDA, and the machine's copy
bandwidth measured in the same run (the yardstick for bandwidth-bound ops)."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from ..profiling import phase, profiled
from .report import Progress


@dataclass
class Timing:
    """Seconds per call over `repeats` timed samples; ``graph``: replays of a CUDA graph."""

    median: float
    p10: float
    p90: float
    repeats: int
    graph: bool = False


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


#: Untimed calls of each way before its first sample: --warmup calls and then at least this
#: long, the same count on every rank (the first calls fault in pages, fill the caches and the
#: allocator's free lists; samples taken before that spread wide).
WARMUP_S = 0.02
#: A sample is a burst of back-to-back calls about ``burst_s`` long, of at most this many calls:
#: a call of tens of us is timed over milliseconds, so that the ranks' skew leaving the barrier,
#: a wake-up or a timer tick is shared out over many calls.
BURST_CALLS = 128


def sample_across_ranks(
    cases: dict,
    device: torch.device,
    warmup: int,
    repeats: int,
    burst_s: float = 0.005,
    progress: Callable[[int, int], None] | None = None,
    unsettled: Callable[[list[dict]], bool] | None = None,
    max_repeats: int = 0,
    label: Callable[[object, str], str] | None = None,
) -> dict:
    """Timed samples of callables that run on every rank together (collectives, boundaries).
    ``cases`` maps a case (e.g. a token count) to ``{way: fn}``; returns this rank's
    ``{case: {way: [seconds per call, one per round]}}``. Called by every rank of the world.

    Each of the ``repeats`` rounds takes one sample of every way of every case, so that a shared
    machine's drift and bursts of other work spread over all cases and ways alike instead of
    landing on one of them; within a case the ways alternate their order from round to round, so
    sample ``r`` of two ways forms a pair taken in the same round (the paired ratio cancels slow
    drift). A sample is a burst of back-to-back calls (about ``burst_s`` of the case's fastest
    way; the same count for every way of a case and on every rank; preceded by one untimed call
    when it holds several) that starts on all ranks together (a barrier first) and ends on the
    device; sample ``r`` is the same burst on every rank, so the slowest rank of each sample is
    the boundary's time.

    With ``unsettled`` (``unsettled([this case's samples of every rank]) -> bool``, the same
    answer on every rank), the cases it names after the first ``repeats`` rounds get further
    rounds of ``repeats``, up to ``max_repeats`` in all, until it names none: the samples go to
    the cases that need them. ``progress(rounds done, rounds planned)`` runs after each round.
    Every call of a way of a case runs inside the profiler phase ``label(case, way)``."""
    import torch.distributed as dist

    def named(case, way):
        return phase(label(case, way)) if label else contextlib.nullcontext()

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    fastest = []  # per case: the least time one call of its fastest way took
    for case, ways in cases.items():
        times = []
        for way, fn in ways.items():
            with named(case, way):
                for _ in range(warmup):
                    fn()
                for _ in range(3):
                    sync()
                    start = time.perf_counter()
                    fn()
                    sync()
                    times.append(time.perf_counter() - start)
        fastest.append(min(times))
    fastest = torch.tensor(fastest, dtype=torch.float64)
    dist.all_reduce(fastest, op=dist.ReduceOp.MAX)  # one burst length on every rank
    # The ways of a case share one burst length, so that the ranks' skew leaving the barrier is
    # spread over as many calls for each of them.
    burst = {
        case: max(1, min(BURST_CALLS, int(burst_s / max(t, 1e-9))))
        for case, t in zip(cases, fastest.tolist())
    }
    for case, t in zip(cases, fastest.tolist()):  # the rest of the warm-up, by time
        for way, fn in cases[case].items():
            with named(case, way):
                for _ in range(min(2 * BURST_CALLS, math.ceil(WARMUP_S / max(t, 1e-9)))):
                    fn()
    samples = {case: {way: [] for way in ways} for case, ways in cases.items()}

    def sample(case, r: int, k: int) -> None:
        ways = cases[case]
        for way in list(ways) if (r + k) % 2 == 0 else list(ways)[::-1]:
            fn, calls = ways[way], burst[case]
            with named(case, way):
                if calls > 1:
                    fn()  # this way's data back in cache, as in a run of equal boundaries
                dist.barrier()
                sync()
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                sync()
            samples[case][way].append((time.perf_counter() - start) / calls)

    todo, done, planned = list(cases), 0, repeats
    gc.collect()
    gc.disable()  # a collection inside a burst would be timed as the boundary's
    try:
        while todo:
            for r in range(done, done + repeats):
                for k, case in enumerate(todo):
                    sample(case, r, k)
                if progress is not None:
                    progress(r + 1, planned)
            done += repeats
            if unsettled is None or done + repeats > max_repeats:
                break
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, {case: samples[case] for case in todo})
            todo = [case for case in todo if unsettled([rank[case] for rank in everyone])]
            planned = done + (repeats if todo else 0)
    finally:
        gc.enable()
    return samples


def pin_rank(rank: int, world: int, threads: int) -> list[int] | None:
    """Bind this rank to its own ``threads`` cores of the ones this process may use, as a serving
    engine binds its workers, when the machine has that many for every rank; returns the cores
    (None: not pinned). Unpinned ranks may share a core, where one rank's busy wait for the
    other takes the time the other needs."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None
    if world * threads > len(cores):
        return None
    mine = cores[rank * threads : (rank + 1) * threads]
    os.sched_setaffinity(0, mine)
    return mine


def slowest_rank(per_rank: Sequence[list[float]]) -> list[float]:
    """Sample by sample, the slowest rank's time: how long the collective step took."""
    return [max(s) for s in zip(*per_rank)]


def spread(samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, p10, p90) of ``samples``: nearest-rank percentiles."""
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return statistics.median(ordered), pick(0.1), pick(0.9)


def median_interval(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float]:
    """(median, lo, hi): the median of ``values`` and a distribution-free confidence interval of
    it from order statistics (the binomial rule: the true median lies between the j-th smallest
    and the j-th largest value with probability >= ``confidence``). With too few values for that
    confidence, the interval is the whole range."""
    ordered = sorted(values)
    n = len(ordered)
    tail = (1 - confidence) / 2
    j, cumulative = 0, 0.0  # j values may lie below the interval on each side
    for k in range(n):
        cumulative += math.comb(n, k) / 2**n
        if cumulative > tail:
            break
        j = k + 1
    j = max(j, 1)
    return statistics.median(ordered), ordered[j - 1], ordered[n - j]


def paired_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Sample-by-sample ratios of two ways timed in the same rounds."""
    return [a / b for a, b in zip(numerator, denominator)]


@dataclass(frozen=True)
class Sampling:
    """How the ranks of a measuring command sample: its --warmup, --repeats, --device, --threads
    (per rank), --profile and --trace."""

    warmup: int
    repeats: int
    device_type: str
    threads: int
    profile: Optional[str]
    trace: str

    @classmethod
    def of(cls, args) -> "Sampling":
        return cls(args.warmup, args.repeats, args.device, args.threads, args.profile, args.trace)

    def rank_device(self, rank: int, world: int) -> torch.device:
        """This rank's device, its CPU rank bound to its own cores (:func:`pin_rank`). Called
        once the rank's transports are set up: the shm transport chooses how long a wait spins
        before it sleeps from the cores its rank may use at that moment, and a rank already
        bound to one core would make every wait sleep almost at once (a wake-up of tens of us,
        as variable, in every exchange)."""
        if self.device_type == "cpu":
            pin_rank(rank, world, torch.get_num_threads())
        return rank_device(self.device_type)

    def sample(self, rank: int, cases: dict, name: str, label, repeats: int = 0, **extend) -> dict:
        """:func:`sample_across_ranks` of ``cases`` with its phase ``label``, rank 0 showing
        progress (as ``name``); ``repeats``: rounds (0: --repeats); ``extend``: its
        ``unsettled`` and ``max_repeats``. Called inside :meth:`profiled`."""
        repeats = repeats or self.repeats
        show = Progress(f"{name}: rounds", repeats) if rank == 0 else None
        device = rank_device(self.device_type)
        return sample_across_ranks(
            cases, device, self.warmup, repeats, progress=show, label=label, **extend
        )

    def profiled(self, rank: int):
        """The region a rank measures in: rank 0 feeds the profiler of --profile (which writes
        its trace on leaving, so no collective may follow inside)."""
        return profiled(self.profile if rank == 0 else None, self.trace)


def run_ranks(prog: str, world: int, fn, how: Sampling, *args):
    """``fn(rank, world, how, *args)`` on ``world`` spawned ranks (gloo on CPU; one GPU per rank
    with NCCL on CUDA); returns the per-rank results, or None when a rank failed (its traceback
    is printed: that is a fault to report, not a usage error)."""
    from ..local_world import run_world

    backend = "cpu:gloo,cuda:nccl" if how.device_type == "cuda" else "gloo"
    try:
        return run_world(world, fn, how, *args, backend=backend, threads=how.threads, timeout=1800)
    except AssertionError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None


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
