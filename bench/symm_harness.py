#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Single-GPU check of the symm transport's kernels: tp simulated ranks in one process, one
cooperative launch per kernel (gridDim.y = tp, rank = blockIdx.y), each rank with its own buffer
and pointer table, through the same device code production runs (mhc_sp._C.SymmSimGroup).

Checks (each recorded in the JSON, pass or fail, a failure never stops the rest):
  replicated fused_layer (Lamport mailbox, one kernel): tp 1/2/4/8, T 1/2/3/7/16, H 4096/7168;
  sharded fused_layer (push-RS, barrier, post+pre, barrier, pull-AG): T 1, tp-1, tp+1, 1000, 8192;
  plain all_reduce (mailbox and exchange), reduce_scatter, all_gather;
  +0/-0 planted in the partials (the mailbox's empty marker is -0);
  two T values captured in CUDA graphs and replayed alternately 200 times on changing inputs;
  a rank that never arrives: the others record a timeout naming it, and return.
Correctness: every simulated rank's outputs are bitwise equal to each other's and to the CUDA
mhc_post_pre of the fp32 rank-order sum of the partials (same kernels, same plan), and small
cases match mhc_sp.reference on the CPU within the design's tolerances.

Times: CUDA-graph replays of one call, median of events, for T = 1 and 16 (replicated) and 8192
(sharded) at H = 7168. All tp simulated ranks share the GPU, so a time is that of every rank
finishing its boundary on about 1/tp of the chip; tp = 1 is the whole GPU for one rank.

  python bench/symm_harness.py --json out.json [--budget-s 150] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from mhc_sp import reference as R  # sum_partials: the rank-order sum every transport makes
from mhc_sp.testing import pre_weights

N = 4  # hc_mult: V4
TP = [1, 2, 4, 8]
REPLICATED_T = [1, 2, 3, 7, 16]
HIDDEN = [4096, 7168]
MAILBOX_SLOT_BYTES = 16 * 8192 * 2
WAIT_S = 2.0  # the simulated groups' timeout: a wait that never completes fails fast


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument(
        "--budget-s", type=float, default=0.0, help="skip checks started after this (0: none)"
    )
    p.add_argument("--quick", action="store_true", help="small shapes only (smoke run)")
    p.add_argument("--graph-replays", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


class Run:
    """Records checks and timings; `check` runs one named check, catching its failure. The JSON
    is rewritten after every check and timing, so a run killed by its step's timeout (a kernel
    that never returns) still leaves what it had."""

    def __init__(self, budget_s: float, json_path: Path | None, meta: dict):
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.json_path = json_path
        self.meta = meta
        self.checks: list[dict] = []
        self.timings: list[dict] = []

    def summary(self, complete: bool) -> dict:
        return {
            **self.meta,
            "complete": complete,
            "seconds": round(time.monotonic() - self.t0, 1),
            "checks": self.checks,
            "timings": self.timings,
            "failed": sum(c["status"] == "failed" for c in self.checks),
            "skipped": sum(c["status"] == "skipped" for c in self.checks),
        }

    def save(self, complete: bool = False) -> dict:
        result = self.summary(complete)
        if self.json_path:
            self.json_path.parent.mkdir(parents=True, exist_ok=True)
            self.json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
        return result

    def timing(self, row: dict):
        self.timings.append(row)
        self.save()

    def over_budget(self) -> bool:
        return self.budget_s > 0 and time.monotonic() - self.t0 > self.budget_s

    def check(self, name: str, fn, **info):
        entry = {"name": name, **info}
        if self.over_budget():
            entry.update(status="skipped", detail="over the time budget")
        else:
            t = time.monotonic()
            try:
                detail = fn()
                torch.cuda.synchronize()
                entry.update(status="ok", detail=detail or "")
            except Exception as e:  # recorded; the run goes on
                entry.update(
                    status="failed",
                    detail=f"{type(e).__name__}: {e}",
                    trace=traceback.format_exc(limit=4),
                )
                try:
                    torch.cuda.synchronize()
                except Exception:
                    pass
            entry["seconds"] = round(time.monotonic() - t, 3)
        self.checks.append(entry)
        self.save()
        mark = {"ok": "ok  ", "failed": "FAIL", "skipped": "skip"}[entry["status"]]
        extra = "" if entry["status"] == "ok" else f"  {entry['detail']}"
        print(f"[{mark}] {name} {info}{extra}", flush=True)


# ---- references --------------------------------------------------------------------------------


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.bfloat16:
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def expect_bitwise(name: str, got: torch.Tensor, want: torch.Tensor):
    if not bitwise_equal(got, want):
        diff = (got.float() - want.float()).abs()
        bad = int(
            (
                got.view(torch.int16 if got.dtype == torch.bfloat16 else torch.int32)
                != want.view(torch.int16 if want.dtype == torch.bfloat16 else torch.int32)
            ).sum()
        )
        raise AssertionError(
            f"{name}: {bad} of {got.numel()} elements differ bitwise "
            f"(max abs diff {float(diff.max()):.3g}), shape {tuple(got.shape)}"
        )


def scalars():
    from mhc_sp.config import MhcConfig

    return MhcConfig().scalars()


def layer_inputs(T: int, H: int, tp: int, seed: int, extra_rows: int = 0, zeros: float = 0.0):
    """Shared stream + weights (random_inputs) and one (T + extra_rows, H) partial per rank; the
    extra rows must be ignored. zeros: fraction of partial entries planted as +0 or -0."""
    from mhc_sp.testing import random_inputs

    i = random_inputs(T, N, H, seed=seed, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    partials = []
    for _r in range(tp):
        p = torch.randn(T + extra_rows, H, generator=g, device="cuda").to(torch.bfloat16)
        if extra_rows:
            p[T:] = 1e4  # garbage past num_tokens
        if zeros:
            mask = torch.rand(T, H, generator=g, device="cuda") < zeros
            sign = torch.rand(T, H, generator=g, device="cuda") < 0.5
            z = torch.where(
                sign, torch.tensor(-0.0, device="cuda"), torch.tensor(0.0, device="cuda")
            )
            p[:T] = torch.where(mask, z.to(torch.bfloat16), p[:T])
            p[:T, : min(H, 64)] = -0.0  # a block where every rank sends -0
        partials.append(p)
    return i, partials


def run_replicated(sim, i, partials, T):
    return sim.fused_layer(
        partials,
        [i["residual"]] * sim.world,
        [i["post"]] * sim.world,
        [i["comb"]] * sim.world,
        *pre_weights(i),
        False,
        T,
        *scalars(),
    )


def check_replicated(sim, i, partials, T, cpu_reference: bool):
    from mhc_sp import ops

    outs = run_replicated(sim, i, partials, T)
    x = R.sum_partials([p[:T] for p in partials])
    want = ops.mhc_post_pre(x, i["residual"], i["post"], i["comb"], *pre_weights(i))
    names = ("residual_out", "post", "comb", "layer_input")
    for r, out in enumerate(outs):
        for name, got, w in zip(names, out, want):
            expect_bitwise(f"rank {r} {name}", got, w)
    if cpu_reference:
        from mhc_sp.testing import assert_close

        ref = R.mhc_post_pre(
            x.cpu(),
            i["residual"].cpu(),
            i["post"].cpu(),
            i["comb"].cpu(),
            i["fn"].cpu(),
            i["scale"].cpu(),
            i["base"].cpu(),
            i["norm_weight"].cpu(),
        )
        for name, got, w in zip(names, outs[0], ref):
            assert_close(got.cpu(), w, name)
    return f"{len(outs)} ranks bitwise equal to mhc_post_pre of the rank-order sum"


def sharded_inputs(i, tp, T):

    return ([R.shard_tokens(i[k], r, tp) for r in range(tp)] for k in ("residual", "post", "comb"))


def check_sharded(sim, i, partials, T, cpu_reference: bool):
    from mhc_sp import ops

    tp = sim.world
    residuals, posts, combs = sharded_inputs(i, tp, T)
    outs = sim.fused_layer(
        partials,
        residuals,
        posts,
        combs,
        *pre_weights(i),
        True,
        T,
        *scalars(),
    )
    x_full = R.sum_partials([p[:T] for p in partials])
    shard = ops.shard_rows(T, tp)
    gathered = []
    for r, (res_out, post_out, comb_out, layer_input) in enumerate(outs):
        valid = max(0, min(shard, T - r * shard))
        x = R.shard_tokens(x_full, r, tp)
        want = ops.mhc_post_pre(x, residuals[r], posts[r], combs[r], *pre_weights(i))
        for name, got, w in zip(
            ("residual_out", "post", "comb"), (res_out, post_out, comb_out), want
        ):
            expect_bitwise(f"rank {r} {name}", got[:valid], w[:valid])
            if valid < shard and bool((got[valid:] != 0).any()):
                raise AssertionError(f"rank {r} {name}: padding rows are not zero")
        gathered.append(want[3][:valid])
        expect_bitwise(f"rank {r} layer_input vs rank 0", layer_input, outs[0][3])
    expect_bitwise("gathered layer_input", outs[0][3], torch.cat(gathered, 0))
    if cpu_reference:
        from mhc_sp.testing import assert_close

        ref = R.fused_layer(
            [p.cpu() for p in partials],
            [t.cpu() for t in residuals],
            [t.cpu() for t in posts],
            [t.cpu() for t in combs],
            i["fn"].cpu(),
            i["scale"].cpu(),
            i["base"].cpu(),
            i["norm_weight"].cpu(),
            True,
            T,
        )
        for r in range(tp):
            for name, got, w in zip(
                ("residual_out", "post", "comb", "layer_input"), outs[r], ref[r]
            ):
                assert_close(got.cpu(), w, f"rank {r} {name}")
    return f"shard {shard} rows; gathered layer_input bitwise on every rank"


def check_collectives(sim, H, seed):
    tp = sim.world
    g = torch.Generator(device="cuda").manual_seed(seed)
    details = []
    for rows, label in ((3, "mailbox"), (64, "exchange")):  # 64 x H bf16 exceeds a mailbox slot
        xs = [
            torch.randn(rows, H, generator=g, device="cuda").to(torch.bfloat16) for _ in range(tp)
        ]
        for x in xs:
            x[:, :16] = -0.0  # every rank -0: the sum is +0 (and -0 is the mailbox's marker)
        outs = sim.collective("all_reduce", xs)
        want = R.sum_partials(xs)
        for r, o in enumerate(outs):
            expect_bitwise(f"all_reduce ({label}) rank {r}", o, want)
        details.append(f"all_reduce {label}")
    rows = 5 * tp
    xs = [torch.randn(rows, H, generator=g, device="cuda").to(torch.bfloat16) for _ in range(tp)]
    outs = sim.collective("reduce_scatter", xs)
    total = R.sum_partials(xs)
    for r, o in enumerate(outs):
        expect_bitwise(f"reduce_scatter rank {r}", o, total[r * 5 : (r + 1) * 5])
    xs = [torch.randn(7, H // 2, generator=g, device="cuda") for _ in range(tp)]  # fp32 rows
    keep = 7 * tp - 3
    outs = sim.collective("all_gather", xs, keep)
    want = torch.cat(xs, 0)[:keep]
    for r, o in enumerate(outs):
        expect_bitwise(f"all_gather rank {r}", o, want)
    return ", ".join(details + ["reduce_scatter", "all_gather fp32 trimmed"])


def check_graphs(sim, H, T_pair, replays, seed, sharded: bool):
    """Two calls captured, replayed alternately on new inputs each time, each replay checked."""
    from mhc_sp import ops

    tp = sim.world
    g = torch.Generator(device="cuda").manual_seed(seed)
    cases = []
    for T in T_pair:
        i, partials = layer_inputs(T, H, tp, seed + T)
        if sharded:
            residuals, posts, combs = (list(v) for v in sharded_inputs(i, tp, T))
        else:
            residuals, posts, combs = [i["residual"]] * tp, [i["post"]] * tp, [i["comb"]] * tp
        cases.append(
            dict(T=T, i=i, partials=partials, residuals=residuals, posts=posts, combs=combs)
        )
    for c in cases:  # eager warm-up (also checks the eager path once more)
        sim.fused_layer(
            c["partials"],
            c["residuals"],
            c["posts"],
            c["combs"],
            c["i"]["fn"],
            c["i"]["scale"],
            c["i"]["base"],
            c["i"]["norm_weight"],
            sharded,
            c["T"],
            *scalars(),
        )
    torch.cuda.synchronize()
    for c in cases:
        c["graph"] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(c["graph"]):
            c["outs"] = sim.fused_layer(
                c["partials"],
                c["residuals"],
                c["posts"],
                c["combs"],
                c["i"]["fn"],
                c["i"]["scale"],
                c["i"]["base"],
                c["i"]["norm_weight"],
                sharded,
                c["T"],
                *scalars(),
            )
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    for k in range(replays):
        c = cases[k % 2]
        T = c["T"]
        for p in c["partials"]:
            p[:T].copy_(torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16))
        if k % 10 == 0:  # the stream changes too, now and then
            for res in c["residuals"]:
                res.copy_(torch.randn(res.shape, generator=g, device="cuda").to(torch.bfloat16))
        if sharded:
            for r, res in enumerate(c["residuals"]):  # padding rows stay zero
                valid = max(0, min(res.shape[0], T - r * res.shape[0]))
                res[valid:] = 0
        c["graph"].replay()
        x_full = R.sum_partials([p[:T] for p in c["partials"]])
        for r in range(tp):
            x = R.shard_tokens(x_full, r, tp) if sharded else x_full
            want = ops.mhc_post_pre(
                x,
                c["residuals"][r],
                c["posts"][r],
                c["combs"][r],
                c["i"]["fn"],
                c["i"]["scale"],
                c["i"]["base"],
                c["i"]["norm_weight"],
            )
            shard = c["residuals"][r].shape[0]
            valid = max(0, min(shard, T - r * shard)) if sharded else T
            bad += (
                c["outs"][r][0][:valid].view(torch.int16) != want[0][:valid].view(torch.int16)
            ).sum()
            if not sharded:
                bad += (c["outs"][r][3].view(torch.int16) != want[3].view(torch.int16)).sum()
    no_errors(sim)
    if int(bad):
        raise AssertionError(f"{int(bad)} elements differ bitwise over {replays} replays")
    return f"{replays} replays alternating T={T_pair}, every one bitwise"


def check_timeout(tp, H, seed, sharded: bool):
    from mhc_sp import _C

    timeout = 0.05
    sim = _C.SymmSimGroup(tp, torch.cuda.current_device(), MAILBOX_SLOT_BYTES, 64 << 20, timeout)
    T = 16 if not sharded else 4 * tp + 1
    i, partials = layer_inputs(T, H, tp, seed)
    absent = tp - 1
    if sharded:
        residuals, posts, combs = (list(v) for v in sharded_inputs(i, tp, T))
    else:
        residuals, posts, combs = [i["residual"]] * tp, [i["post"]] * tp, [i["comb"]] * tp

    def call():
        sim.fused_layer(
            partials,
            residuals,
            posts,
            combs,
            *pre_weights(i),
            sharded,
            T,
            *scalars(),
            absent=absent,
        )

    t = time.monotonic()
    call()
    torch.cuda.synchronize()
    first = time.monotonic() - t
    errors = sim.errors()
    if errors[absent] is not None:
        raise AssertionError(f"the absent rank recorded an error: {errors[absent]}")
    missing = [r for r in range(tp) if r != absent and errors[r] is None]
    if missing:
        raise AssertionError(f"ranks {missing} recorded no error: {errors}")
    named = [e for e in errors if e is not None and e["code"] == "timeout" and e["peer"] == absent]
    if not named:
        raise AssertionError(f"no rank recorded a timeout naming rank {absent}: {errors}")
    text = sim.describe_error(named[0]["rank"])
    if f"waiting for rank {absent}" not in text:
        raise AssertionError(f"message does not name rank {absent}: {text}")
    t = time.monotonic()  # a later call on the broken workspace returns at once
    call()
    torch.cuda.synchronize()
    again = time.monotonic() - t
    if first > 10 * timeout + 5 or again > 5:
        raise AssertionError(f"took {first:.2f} s (timeout {timeout} s), then {again:.2f} s")
    return f"first call {first:.3f} s; {text}"


def no_errors(sim):
    errors = [e for e in sim.errors() if e is not None]
    if errors:
        raise AssertionError(f"errors recorded: {errors}")
    return "none"


def time_graph(fn, warmup=10, reps=50):
    """(median, min) microseconds of one call: graph replays, or eager calls (launch overhead
    included) when the call cannot be captured; the third item says which."""
    fn()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run, how = graph.replay, "graph"
    except Exception:
        torch.cuda.synchronize()
        run, how = fn, "eager"
    for _ in range(warmup):
        run()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times), min(times), how


def half_bytes_for(tp, T_max, H):
    from mhc_sp import _C

    need = _C.symm_exchange_layout("fused_layer", True, T_max, T_max, H, 2, tp)["need"]
    return max(need, 64 << 20)


def check_replicated_sizes(run, sim, tp, H, seed):
    for T in REPLICATED_T:
        i, partials = layer_inputs(T, H, tp, seed + T)
        run.check(
            "replicated",
            lambda: check_replicated(sim, i, partials, T, T <= 7),
            tp=tp,
            T=T,
            H=H,
        )


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("symm_harness: no GPU", file=sys.stderr)
        return 2
    import mhc_sp
    from mhc_sp import _C

    if not hasattr(_C, "SymmSimGroup"):
        print("symm_harness: mhc_sp was built without CUDA", file=sys.stderr)
        return 2
    meta = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "build_info": mhc_sp.build_info(),
    }
    run = Run(args.budget_s, args.json, meta)
    tps = [1, 2] if args.quick else TP
    hidden = [4096] if args.quick else HIDDEN
    sharded_big = [] if args.quick else [1000, 8192]
    dev = torch.cuda.current_device()
    for tp in tps:
        T_max = max([tp + 1, *sharded_big])
        sim = _C.SymmSimGroup(
            tp, dev, MAILBOX_SLOT_BYTES, half_bytes_for(tp, T_max, max(hidden)), WAIT_S
        )
        H = hidden[-1]  # the other hidden sizes come after the timings
        check_replicated_sizes(run, sim, tp, H, args.seed)
        for T in sorted({1, tp - 1, tp + 1, *sharded_big} - {0}):
            i, partials = layer_inputs(T, H, tp, args.seed + 100 + T, extra_rows=3)
            run.check(
                "sharded", lambda: check_sharded(sim, i, partials, T, T <= 16), tp=tp, T=T, H=H
            )
        i, partials = layer_inputs(16, H, tp, args.seed + 7, zeros=0.3)
        run.check(
            "sentinel_zeros",
            lambda: check_replicated(sim, i, partials, 16, False),
            tp=tp,
            T=16,
            H=H,
        )
        i, partials = layer_inputs(2 * tp + 1, H, tp, args.seed + 8, zeros=0.3)
        run.check(
            "sentinel_zeros_sharded",
            lambda: check_sharded(sim, i, partials, 2 * tp + 1, False),
            tp=tp,
            T=2 * tp + 1,
            H=H,
        )
        run.check("collectives", lambda: check_collectives(sim, H, args.seed), tp=tp, H=H)
        run.check("no_errors_recorded", lambda: no_errors(sim), tp=tp)
        sim = None  # frees the simulated ranks' buffers before the next group
    # Times at H = 7168 (V4-Pro), before the slower checks so that a tight budget keeps them.
    H = 7168 if not args.quick else hidden[-1]
    for tp in [1, 8] if not args.quick else [1, 2]:
        T_big = 8192 if not args.quick else 256
        sim = _C.SymmSimGroup(tp, dev, MAILBOX_SLOT_BYTES, half_bytes_for(tp, T_big, H), WAIT_S)
        for T, sharded in ((1, False), (16, False), (T_big, True)):
            if run.over_budget():
                break
            i, partials = layer_inputs(T, H, tp, args.seed)
            if sharded:
                residuals, posts, combs = (list(v) for v in sharded_inputs(i, tp, T))
            else:
                residuals, posts, combs = [i["residual"]] * tp, [i["post"]] * tp, [i["comb"]] * tp

            def call():
                sim.fused_layer(
                    partials,
                    residuals,
                    posts,
                    combs,
                    *pre_weights(i),
                    sharded,
                    T,
                    *scalars(),
                )

            try:
                median_us, min_us, how = time_graph(call)
            except Exception as e:
                run.timing(dict(tp=tp, T=T, H=H, sharded=sharded, error=str(e)))
                continue
            row = dict(
                tp=tp,
                T=T,
                H=H,
                sharded=sharded,
                median_us=round(median_us, 2),
                min_us=round(min_us, 2),
                timed=how,
            )
            if sharded:
                shard = -(-T // tp)
                remote = (
                    2 * (tp - 1) * shard * H * 2
                )  # pushed partial rows + pulled layer_input rows
                # HBM traffic of one rank: partial read, landed rows written + read, stream read +
                # written, layer_input published + gathered, fn (fp32) read
                local = (
                    T * H * 2
                    + 2 * tp * shard * H * 2
                    + 2 * shard * N * H * 2
                    + shard * H * 2
                    + T * H * 2
                    + N * (N + 2) * N * H * 4
                )
                row.update(
                    remote_bytes_per_rank=remote,
                    hbm_bytes_per_rank=local,
                    hbm_gbps_all_ranks=round(tp * local / (median_us * 1e-6) / 1e9, 1),
                )
            run.timing(row)
            print(f"[time] {row}", flush=True)
        sim = None  # frees the simulated ranks' buffers before the next group

    for tp in tps:
        if len(hidden) > 1:
            sim = _C.SymmSimGroup(
                tp, dev, MAILBOX_SLOT_BYTES, half_bytes_for(tp, tp + 1, max(hidden)), WAIT_S
            )
            for H in hidden[:-1]:
                check_replicated_sizes(run, sim, tp, H, args.seed)
            sim = None
    for tp in [t for t in tps if t > 1]:
        run.check(
            "timeout_replicated", lambda: check_timeout(tp, hidden[-1], args.seed, False), tp=tp
        )
        run.check("timeout_sharded", lambda: check_timeout(tp, hidden[-1], args.seed, True), tp=tp)

    for tp in [t for t in tps if t > 1]:
        sim = _C.SymmSimGroup(
            tp, dev, MAILBOX_SLOT_BYTES, half_bytes_for(tp, 1000, hidden[-1]), WAIT_S
        )
        run.check(
            "graph_replicated",
            lambda: check_graphs(sim, hidden[-1], (1, 7), args.graph_replays, args.seed, False),
            tp=tp,
        )
        run.check(
            "graph_sharded",
            lambda: check_graphs(
                sim, hidden[-1], (tp + 1, 100), max(2, args.graph_replays // 4), args.seed, True
            ),
            tp=tp,
        )
        sim = None  # frees the simulated ranks' buffers before the next group
    result = run.save(complete=True)
    print(
        f"symm_harness: {len(run.checks)} checks, {result['failed']} failed, "
        f"{result['skipped']} skipped, {result['seconds']} s",
        flush=True,
    )
    for t in run.timings:
        print(f"  {t}")
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
