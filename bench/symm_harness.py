#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times of the symm transport's boundary kernels on one GPU, each beside its roofline. The
correctness checks of the same kernels are pytest files run by bench/gpu_check.sh
(tests/cuda/test_cuda_symm.py: simulated ranks and the production launch;
tests/cuda/test_cuda_symm_world.py: two processes on one GPU).

Rows (CUDA-graph replays of one call, median and p10/p90 of CUDA events, H = 7168 by default):
  decode     replicated fused_layer (Lamport mailbox, one kernel), T = 1, 4, 16;
  sharded    sharded fused_layer (push reduce-scatter, post + pre, gather; two kernels), T = 8192;
each with tp simulated ranks in one cooperative launch (tp = 8: every rank on 1/8 of the chip, so
a time is that of all eight boundaries together, not one rank's), and tp = 1 through the
production launch (one rank on the whole GPU, the sharded finish a programmatic dependent launch).

Roofline: the fewest HBM bytes the call must move on this GPU (every input read once, every output
written once, each rank's rows written to and read from its peers' buffers once, fn read once),
over the copy bandwidth measured in the same run (a device-to-device copy, bytes read + written).
The decode goal is 15 us for the whole boundary (all-reduce + post + pre + RMSNorm) of one rank.

  python bench/symm_harness.py --json out.json [--budget-s 60] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

N = 4  # hc_mult: V4
DECODE_GOAL_US = 15.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--budget-s", type=float, default=0.0, help="skip rows started after this")
    p.add_argument("--quick", action="store_true", help="small shapes only (smoke run)")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--reps", type=int, default=50)
    return p.parse_args(argv)


def copy_gbps(nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Device-to-device copy bandwidth, bytes read plus written, median of `reps`."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    return 2 * nbytes / statistics.median(times) / 1e9


def hbm_bytes(tp: int, T: int, H: int, sharded: bool) -> int:
    """The fewest bytes all tp ranks of one call move through this GPU's memory."""
    fn = N * (N + 2) * N * H * 4  # the pre weights, one copy shared by the simulated ranks
    rows = -(-T // tp) if sharded else T  # each rank's stream rows
    stream = 2 * rows * N * H * 2  # residual read, residual_out written
    partial = T * H * 2  # each rank's un-reduced partial, read once
    exchanged = 2 * T * H * 2  # its rows written into the peers' buffers, read back there
    if sharded:  # layer_input: the shard published, the whole gathered on every rank
        exchanged += 2 * rows * H * 2 + T * H * 2
    else:
        exchanged *= 1 if tp == 1 else tp  # every rank sends all T rows to every rank
        exchanged += T * H * 2  # layer_input written
    return fn + tp * (stream + partial + exchanged)


def time_call(fn, reps: int):
    """Median, p10, p90 microseconds of graph replays of `fn` (eager when it cannot be
    captured; the last item says which)."""
    fn()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run, how = graph.replay, "graph"
    except Exception:  # noqa: BLE001  (timed eagerly then)
        torch.cuda.synchronize()
        run, how = fn, "eager"
    for _ in range(10):
        run()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    q = statistics.quantiles(times, n=10)
    return statistics.median(times), q[0], q[-1], how


def boundary(sim, tp: int, T: int, H: int, sharded: bool, production: bool):
    """A closure running one fused_layer of tp simulated ranks on fresh random inputs."""
    from mhc_sp import reference as R
    from mhc_sp.config import MhcConfig
    from mhc_sp.testing import pre_weights, random_inputs

    i = random_inputs(T, N, H, seed=T, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(T + 1)
    partials = [torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16) for _ in range(tp)]

    def mine(name, r):
        return R.shard_tokens(i[name], r, tp).contiguous() if sharded else i[name]

    streams = [[mine(k, r) for r in range(tp)] for k in ("residual", "post", "comb")]
    scalars = MhcConfig().scalars()
    weights = pre_weights(i)

    def call():
        sim.fused_layer(partials, *streams, *weights, sharded, T, *scalars, production=production)

    return call


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("symm_harness: no GPU", file=sys.stderr)
        return 2
    import mhc_sp
    from mhc_sp import _C
    from mhc_sp.testing import load_testing_module

    _testing = load_testing_module()
    if _testing is None or not hasattr(_testing, "SymmSimGroup"):
        print(
            "symm_harness: needs a CUDA build of mhc_sp with its testing module "
            "(MHC_SP_CUDA=1 MHC_SP_TESTING=1)",
            file=sys.stderr,
        )
        return 2
    t0 = time.monotonic()
    H = 1024 if args.quick else args.hidden
    big = 256 if args.quick else 8192
    bw = copy_gbps(64 << 20 if args.quick else 1 << 30)
    result = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "build_info": mhc_sp.build_info(),
        "copy_gbps": round(bw, 1),
        "decode_goal_us": DECODE_GOAL_US,
        "timings": [],
        "skipped": [],
    }

    def save():
        result["seconds"] = round(time.monotonic() - t0, 1)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")

    C = _C.symm_constants()
    plan = [(8, False), (1, True)] if not args.quick else [(2, False), (1, True)]
    for tp, production in plan:
        need = _testing.symm_exchange_layout("fused_layer", True, big, big, H, 2, tp)["need"]
        sim = _testing.SymmSimGroup(
            tp, torch.cuda.current_device(), C["default_mailbox_slot_bytes"], need, 10.0
        )
        for T, sharded in ((1, False), (4, False), (16, False), (big, True)):
            row = dict(tp=tp, T=T, H=H, sharded=sharded, production=production)
            if args.budget_s and time.monotonic() - t0 > args.budget_s:
                result["skipped"].append(row)
                continue
            try:
                med, p10, p90, how = time_call(
                    boundary(sim, tp, T, H, sharded, production), args.reps
                )
            except Exception as e:  # noqa: BLE001  (recorded; the other rows still run)
                row["error"] = f"{type(e).__name__}: {e}"
                result["timings"].append(row)
                save()
                continue
            nbytes = hbm_bytes(tp, T, H, sharded)
            floor_us = nbytes / (bw * 1e9) * 1e6
            row.update(
                median_us=round(med, 2),
                p10_us=round(p10, 2),
                p90_us=round(p90, 2),
                timed=how,
                hbm_bytes=nbytes,
                roofline_us=round(floor_us, 2),
                of_roofline=round(floor_us / med, 3),
            )
            if not sharded:
                row["within_decode_goal"] = med <= DECODE_GOAL_US
            errors = [e for e in sim.errors() if e is not None]
            if errors:
                row["errors"] = errors
            result["timings"].append(row)
            save()
            print(f"[time] {row}", flush=True)
        del sim
    save()
    print(f"symm_harness: copy {bw:.0f} GB/s, {result['seconds']} s")
    for r in result["timings"]:
        if "median_us" in r:
            print(
                f"  tp={r['tp']} T={r['T']} sharded={r['sharded']} production={r['production']}: "
                f"{r['median_us']} us (roofline {r['roofline_us']} us, {r['of_roofline']:.0%})"
            )
    failed = [r for r in result["timings"] if "error" in r or "errors" in r]
    return 1 if failed or result["skipped"] else 0


if __name__ == "__main__":
    sys.exit(main())
