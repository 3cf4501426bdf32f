# SPDX-License-Identifier: Apache-2.0
"""A DeepSeek-V4 decoder layer as the engine writes it, beside the same layer on mhc_sp's fused
ops, on tp CPU ranks (docs/engines.md explains the mapping line by line).

    python examples/engine_layer.py                     # tp=2, 16 and 256 tokens, hidden size 4096
    python examples/engine_layer.py -tp 2 --tokens 64 --hidden-size 1024 --layers 2 --json r.json

``EngineLayer`` follows the structure of vLLM's sequence-parallel DeepSeek-V4 decoder layer: the
attention and the MoE end in a row-parallel projection that returns this rank's un-reduced
partial (``reduce_results=False``); after each, the layer reduce-scatters it (sharded forward) or
all-reduces it (replicated), runs the fused mHC post + pre of the next sublayer (vLLM's
``mhc_fused_post_pre``, here its call form in ``mhc_sp.compat``), and all-gathers the next
sublayer's input when sharded. Its collectives are either ``torch.distributed``'s (what the
engine's group coordinator calls) or mhc_sp's own (``mhc_sp.ops.reduce_scatter`` etc.) in the same
places. ``FusedLayer`` is the same layer with each of those boundaries as one ``fused_layer``.

For every token count, sharded and replicated, the script runs the entry after the embedding, a
stack of ``--layers`` layers from one mid-model state and the head, all three ways, checks that
the engine layout on mhc_sp's collectives and the fused ops give bitwise the same residual stream,
layer inputs, hidden state and final stream (the exit status says so), reports whether
torch.distributed's agree with them within the bf16 tolerance and by how much, and then times the
layer stack each way (the slowest rank, per layer).
Attention and MoE are stand-ins of the same shape (a column-parallel and a row-parallel
projection each): their cost is the "sublayers only" column.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import mhc_sp.distributed as msd
from mhc_sp import compat, ops
from mhc_sp.config import MhcConfig

CFG = MhcConfig()  # DeepSeek-V4's constants
STACKS = ("engine, torch.distributed", "engine, mhc_sp collectives", "mhc_sp fused")


# ---- weights, the same on every rank --------------------------------------------------------


def hc_weights(g: torch.Generator, n: int, H: int) -> tuple:
    """One sublayer's mHC pre weights ``fn (n(n+2), nH), hc_scale (3,), hc_base (n(n+2),)`` and
    its RMSNorm weight ``(H,)`` bf16."""
    M = n * (n + 2)
    fn = torch.randn(M, n * H, generator=g) * (n * H) ** -0.5
    scale = 0.5 + torch.rand(3, generator=g)
    base = torch.randn(M, generator=g) * 0.5
    norm = (1 + 0.1 * torch.randn(H, generator=g)).to(torch.bfloat16)
    return fn, scale, base, norm


class StandIns:
    """Attention and MoE of one layer on this rank, as stand-ins of their parallel structure: a
    column-parallel projection to this rank's ``inter / tp`` features, a nonlinearity, and a
    row-parallel projection back to ``H`` whose output is this rank's un-reduced partial (the
    engine's ``reduce_results=False``)."""

    def __init__(self, g: torch.Generator, H: int, inter: int, rank: int, tp: int):
        cols = slice(rank * inter // tp, (rank + 1) * inter // tp)

        def column(k):  # (H, inter) sliced to this rank's columns
            return (torch.randn(H, k, generator=g) * H**-0.5)[:, cols].contiguous()

        def row(k):  # (inter, H) sliced to this rank's rows
            return (torch.randn(k, H, generator=g) * k**-0.5)[cols].contiguous()

        self.attn_in, self.attn_out = column(inter), row(inter)
        self.ffn_gate, self.ffn_up, self.ffn_down = column(inter), column(inter), row(inter)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(x.float() @ self.attn_in) @ self.attn_out).to(torch.bfloat16)

    def moe(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return ((F.silu(h @ self.ffn_gate) * (h @ self.ffn_up)) @ self.ffn_down).to(torch.bfloat16)


class LayerWeights:
    def __init__(self, g: torch.Generator, n: int, H: int, inter: int, rank: int, tp: int):
        self.attn_hc = hc_weights(g, n, H)
        self.ffn_hc = hc_weights(g, n, H)
        self.sublayers = StandIns(g, H, inter, rank, tp)


# ---- the engine's collectives, two ways -------------------------------------------------------


class TorchDistributed:
    """``tensor_model_parallel_all_gather(x, dim=0)``, ``..._reduce_scatter(x, dim=0)`` and
    ``..._all_reduce(x)`` on the TP process group, as the engine's group coordinator runs them."""

    def __init__(self, group):
        self.group, self.tp = group, dist.get_world_size(group)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        self._gather, self._scatter = gather, scatter

    def all_gather(self, x):
        out = x.new_empty((x.shape[0] * self.tp, *x.shape[1:]))
        self._gather(out, x.contiguous(), group=self.group)
        return out

    def reduce_scatter(self, x):
        out = x.new_empty((x.shape[0] // self.tp, *x.shape[1:]))
        self._scatter(out, x.contiguous(), group=self.group)
        return out

    def all_reduce(self, x):
        x = x.clone()
        dist.all_reduce(x, group=self.group)
        return x


class MhcSpCollectives:
    """The same three calls on mhc_sp's collectives (the group's transport: shm on one host)."""

    def __init__(self, group):
        self.group = group

    def all_gather(self, x):
        return ops.all_gather(x, self.group)

    def reduce_scatter(self, x):
        return ops.reduce_scatter(x, self.group)

    def all_reduce(self, x):
        return ops.all_reduce(x, self.group)


# ---- the layer in the engine's structure, and with the fused ops -------------------------------


def hc_args(hc):
    """compat.mhc_pre / mhc_fused_post_pre's weight and constant arguments, vLLM's names."""
    fn, scale, base, _ = hc
    return dict(
        fn=fn,
        hc_scale=scale,
        hc_base=base,
        rms_eps=CFG.rms_eps,
        hc_pre_eps=CFG.hc_pre_eps,
        hc_sinkhorn_eps=CFG.hc_sinkhorn_eps,
        hc_post_mult_value=CFG.hc_post_mult,
        sinkhorn_repeat=CFG.sinkhorn_iters,
        norm_weight=hc[3],
        norm_eps=CFG.norm_eps,
    )


class EngineLayer:
    """``DeepseekV4DecoderLayer.forward`` of the engine's SP change. In: ``x``, the previous
    sublayer's output already reduced (reduce-scattered to this rank's rows when sharded,
    all-reduced otherwise), and this rank's stream ``residual (rows, n, H)``, ``post_mix
    (rows, n, 1)``, ``res_mix (rows, n, n)``; out: the same four after this layer."""

    def __init__(self, w: LayerWeights, comm):
        self.w, self.comm = w, comm

    def forward(self, x, residual, post_mix, res_mix, is_sp_sharded: bool, trace=None):
        w, comm = self.w, self.comm
        # Attention, then the MoE: each behind the fused post+pre of its own mHC weights.
        for hc, sublayer in ((w.attn_hc, w.sublayers.attention), (w.ffn_hc, w.sublayers.moe)):
            residual, post_mix, res_mix, x = compat.mhc_fused_post_pre(
                x, residual, post_mix, res_mix, **hc_args(hc)
            )
            if is_sp_sharded:
                x = comm.all_gather(x)
            if trace is not None:
                trace.append((residual, x))
            x = sublayer(x)  # un-reduced partial
            x = comm.reduce_scatter(x) if is_sp_sharded else comm.all_reduce(x)
        return x, residual, post_mix, res_mix


class FusedLayer:
    """The same layer on mhc_sp: each boundary (reduce, post, pre + norm, gather) is one
    ``fused_layer``. In: the previous sublayer's un-reduced ``partial (num_tokens, H)`` and this
    rank's stream ``residual, post (rows, n), comb``; out: the MoE's partial and the stream."""

    def __init__(self, w: LayerWeights, group: str):
        self.w, self.group = w, group

    def forward(self, partial, residual, post, comb, sharded: bool, num_tokens: int, trace=None):
        w, group = self.w, self.group
        residual, post, comb, x = ops.fused_layer(
            partial, residual, post, comb, *w.attn_hc, group, sharded, num_tokens, CFG
        )
        if trace is not None:
            trace.append((residual, x))
        partial = w.sublayers.attention(x)
        residual, post, comb, x = ops.fused_layer(
            partial, residual, post, comb, *w.ffn_hc, group, sharded, num_tokens, CFG
        )
        if trace is not None:
            trace.append((residual, x))
        return w.sublayers.moe(x), residual, post, comb


# ---- entry, head and the mid-model state --------------------------------------------------------


def engine_entry(embedded, hc, comm, rank, tp, is_sp_sharded):
    """``DeepseekV4Model.forward`` after the embedding, then layer 0's ``residual is None`` branch:
    expand to n streams, take this rank's chunk when sharded, mhc_pre (+ attn_norm), gather."""
    stream = embedded.unsqueeze(-2).repeat(1, CFG.hc_mult, 1)
    if is_sp_sharded:
        stream = ops.shard_tokens(stream, rank, tp)  # the engine's sequence_parallel_chunk
    post_mix, res_mix, x = compat.mhc_pre(stream, **hc_args(hc))
    if is_sp_sharded:
        x = comm.all_gather(x)
    return stream, post_mix, res_mix, x


def engine_head(x, residual, post_mix, res_mix, head, comm, is_sp_sharded):
    """After the last layer: mhc_post, gather the stream when sharded, keep it flat for the MTP
    layer's buffer, collapse it with hc_head."""
    stream = compat.mhc_post(x, residual, post_mix, res_mix)
    if is_sp_sharded:
        stream = comm.all_gather(stream)
    fn, scale, base = head
    hidden = compat.hc_head(stream, fn, scale, base, CFG.rms_eps, CFG.hc_eps)
    return hidden, stream.flatten(1)


def fused_head(partial, residual, post, comb, head, group, sharded, num_tokens):
    hidden, rows = ops.fused_head(partial, residual, post, comb, *head, group, sharded, num_tokens)
    flat = rows.flatten(1)
    return hidden, ops.all_gather(flat, group, num_tokens) if sharded else flat


class Setup:
    """Everything one (token count, sharded) case needs on this rank, built from one seed."""

    def __init__(self, rank, tp, tokens, H, layers, inter, sharded, seed=0):
        n = CFG.hc_mult
        self.rank, self.tp, self.sharded = rank, tp, sharded
        # The engine's runner pads a forward that may shard to a multiple of tp.
        self.num_tokens = -(-tokens // tp) * tp if sharded else tokens
        T = self.num_tokens
        g = torch.Generator().manual_seed(seed)
        self.layers = [LayerWeights(g, n, H, inter, rank, tp) for _ in range(layers)]
        self.head = (
            torch.randn(n, n * H, generator=g) * (n * H) ** -0.5,
            0.5 + torch.rand(1, generator=g),
            torch.randn(n, generator=g) * 0.5,
        )
        self.embedded = torch.randn(T, H, generator=g).to(torch.bfloat16)
        # A mid-model state: the stream and its coefficients as the previous layer left them,
        # and that layer's MoE partial, different on every rank.
        stream = torch.randn(T, n, H, generator=g).to(torch.bfloat16)
        fn, scale, base, norm = hc_weights(g, n, H)
        post, comb, _ = ops.mhc_pre(stream, fn, scale, base, norm, CFG)
        mine = (lambda t: ops.shard_tokens(t, rank, tp)) if sharded else (lambda t: t)
        self.stream = (mine(stream), mine(post), mine(comb))
        partials = [torch.randn(T, H, generator=g).to(torch.bfloat16) for _ in range(tp)]
        self.partial = partials[rank]


def run_stacks(setup: Setup, comms: dict, group: str) -> dict:
    """The layer stack and head from the mid-model state, the three ways; per way, the trace
    ``[(residual, layer_input) per boundary] + [(hidden, final_stream)]``."""
    s, out = setup, {}
    residual, post, comb = s.stream
    for name, comm in comms.items():  # the engine's layout
        trace = []
        x = comm.reduce_scatter(s.partial) if s.sharded else comm.all_reduce(s.partial)
        state = (x, residual, post.unsqueeze(-1), comb)
        for w in s.layers:
            state = EngineLayer(w, comm).forward(*state, s.sharded, trace)
        out[name] = trace + [engine_head(*state, s.head, comm, s.sharded)]
    trace = []
    state = (s.partial, residual, post, comb)
    for w in s.layers:
        state = FusedLayer(w, group).forward(*state, s.sharded, s.num_tokens, trace)
    out["mhc_sp fused"] = trace + [fused_head(*state, s.head, group, s.sharded, s.num_tokens)]
    return out


def entries(setup: Setup, comms: dict, group: str):
    """The entry after the embedding: the engine's (on each collective) and ``fused_entry``."""
    s, hc = setup, setup.layers[0].attn_hc
    out = {n: engine_entry(s.embedded, hc, c, s.rank, s.tp, s.sharded) for n, c in comms.items()}
    out["mhc_sp fused"] = ops.fused_entry(s.embedded, *hc, group, s.sharded, CFG)
    return out


def make_comms(group_pg, group: str) -> dict:
    return {STACKS[0]: TorchDistributed(group_pg), STACKS[1]: MhcSpCollectives(group)}


def traces(setup: Setup, comms: dict, group: str) -> dict:
    """:func:`run_stacks` and :func:`entries` traced."""
    return {
        "stacks": run_stacks(setup, comms, group),
        "entries": entries(setup, comms, group),
    }


# ---- checks and times --------------------------------------------------------------------------


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.view(ints[a.element_size()]), b.view(ints[b.element_size()]))


def largest_difference(a_stack, b_stack) -> float:
    return max(
        (a.reshape(b.shape).float() - b.float()).abs().max().item() if a.numel() else 0.0
        for pa, pb in zip(a_stack, b_stack)
        for a, b in zip(pa, pb)
    )


def within_tolerance(a_stack, b_stack) -> bool:
    """Every tensor of ``a_stack`` within the contract's bf16 / fp32 tolerance of ``b_stack``'s."""
    from mhc_sp.testing import assert_close

    try:
        for pa, pb in zip(a_stack, b_stack):
            for a, b in zip(pa, pb):
                assert_close(a.reshape(b.shape), b)
    except AssertionError:
        return False
    return True


def check(traced: dict) -> dict:
    """What one rank's traces show: whether the engine layout on mhc_sp's collectives is bitwise
    the fused ops, and how far torch.distributed's and the engine's entry are from them."""
    stacks, entry = traced["stacks"], traced["entries"]
    fused, engine_entry_ = stacks["mhc_sp fused"], [entry[STACKS[1]]]
    bitwise = lambda stack: all(  # noqa: E731
        same_bits(a, b) for pa, pb in zip(stack, fused) for a, b in zip(pa, pb)
    )
    return {
        "mhc_sp collectives bitwise": bitwise(stacks[STACKS[1]]),
        "torch.distributed bitwise": bitwise(stacks[STACKS[0]]),
        "torch.distributed within tolerance": within_tolerance(stacks[STACKS[0]], fused),
        "torch.distributed largest difference": largest_difference(stacks[STACKS[0]], fused),
        "entry within tolerance": within_tolerance(engine_entry_, [entry["mhc_sp fused"]]),
        "entry largest difference": largest_difference(engine_entry_, [entry["mhc_sp fused"]]),
    }


def time_rank(rank, world, cases, H, layers, inter, warmup, repeats, keep_traces=False):
    """One rank (a ``run_world`` target): for every ``(tokens, sharded)`` case, the checks, then
    the times of the layer stack each way. With ``keep_traces``, also the traces themselves,
    serialised (``torch.load(io.BytesIO(...))``): tensors cannot cross the result queue after
    their rank has exited."""
    from mhc_sp.bench.timing import pin_rank, sample_across_ranks

    pin_rank(rank, world, 1)
    group = msd.init(device="cpu", transport="auto")
    comms = make_comms(dist.group.WORLD, group)
    timed, checks, kept = {}, {}, {}
    for tokens, sharded in cases:
        s = Setup(rank, world, tokens, H, layers, inter, sharded)
        traced = traces(s, comms, group)
        checks[(tokens, sharded)] = check(traced)
        if keep_traces:
            buf = io.BytesIO()
            torch.save({"num_tokens": s.num_tokens, **traced}, buf)
            kept[(tokens, sharded)] = buf.getvalue()
        timed[(tokens, sharded)] = {
            STACKS[0]: engine_way(s, comms[STACKS[0]]),
            STACKS[1]: engine_way(s, comms[STACKS[1]]),
            STACKS[2]: fused_way(s, group),
            "sublayers only": sublayers_way(s),
        }
    samples = sample_across_ranks(timed, torch.device("cpu"), warmup, repeats)
    transport = str(msd.transport(group, "cpu"))
    return {"transport": transport, "checks": checks, "samples": samples, "traces": kept}


def engine_way(s: Setup, comm):
    residual, post, comb = s.stream
    x0 = comm.reduce_scatter(s.partial) if s.sharded else comm.all_reduce(s.partial)
    layers = [EngineLayer(w, comm) for w in s.layers]

    def forward():
        state = (x0, residual, post.unsqueeze(-1), comb)
        for layer in layers:
            state = layer.forward(*state, s.sharded)

    return forward


def fused_way(s: Setup, group):
    layers = [FusedLayer(w, group) for w in s.layers]

    def forward():
        state = (s.partial, *s.stream)
        for layer in layers:
            state = layer.forward(*state, s.sharded, s.num_tokens)

    return forward


def sublayers_way(s: Setup):
    x = s.partial  # any (num_tokens, H) input: the stand-ins' cost does not depend on values

    def forward():
        for w in s.layers:
            w.sublayers.moe(x)
            w.sublayers.attention(x)

    return forward


def measure(tp, cases, H, layers, inter, warmup, repeats, keep_traces=False, start="spawn"):
    """:func:`time_rank` on ``tp`` CPU ranks started by ``mhc_sp.local_world.run_world`` (``start``:
    its "spawn" or "forkserver"); returns the per-rank results."""
    from mhc_sp.local_world import run_world

    args = (cases, H, layers, inter, warmup, repeats, keep_traces)
    return run_world(tp, time_rank, *args, timeout=3600, start=start)


def report(ranks: list, H: int, layers: int, inter: int) -> list:
    """Print the checks and the times side by side, one row per case; returns the rows."""
    from mhc_sp.bench.timing import median_interval, paired_ratios, slowest_rank

    tp, repeats = len(ranks), len(next(iter(next(iter(ranks[0]["samples"].values())).values())))
    print(
        f"{layers} DeepSeek-V4 layers, hidden size {H}, {CFG.hc_mult} streams, on {tp} cpu ranks "
        f"(mhc_sp transport {ranks[0]['transport']}, 1 thread each); stand-in sublayers "
        f"{inter // tp} wide per rank. Per layer: the slowest rank's median of {repeats} rounds."
    )
    widths = (6, 7, 26, 26, 12, 14, 18, 8)
    names = ("tokens", "sharded", *(f"{w}, ms" for w in STACKS), "sublayers, ms", "speedup, x")
    print(" ".join(f"{name:>{w}}" for name, w in zip((*names, "bitwise"), widths)))
    rows = []
    for case in ranks[0]["samples"]:
        per_way = {
            way: slowest_rank([r["samples"][case][way] for r in ranks])
            for way in ranks[0]["samples"][case]
        }
        ms = {way: statistics.median(v) / layers * 1e3 for way, v in per_way.items()}
        speedup = median_interval(paired_ratios(per_way[STACKS[0]], per_way[STACKS[2]]))
        checks = [r["checks"][case] for r in ranks]
        row = {
            "tokens": case[0],
            "sharded": case[1],
            "ms_per_layer": ms,
            "speedup_fused_vs_engine_torch_distributed": speedup,
            **{k: all(c[k] for c in checks) for k in checks[0] if "difference" not in k},
            **{k: max(c[k] for c in checks) for k in checks[0] if "difference" in k},
        }
        rows.append(row)
        cells = (
            case[0],
            str(case[1]),
            *(f"{ms[w]:.3f}" for w in (*STACKS, "sublayers only")),
            "{:.2f} [{:.2f}-{:.2f}]".format(*speedup),
            "yes" if row["mhc_sp collectives bitwise"] else "NO",
        )
        print(" ".join(f"{cell:>{w}}" for cell, w in zip(cells, widths)))
    print(
        "speedup: engine layout on torch.distributed / mhc_sp fused, paired by round, median "
        "[95% CI]; bitwise: the engine layout on mhc_sp's collectives gives bitwise the fused "
        "ops' residual stream, layer inputs, hidden state and final stream on every rank."
    )
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-tp", "--tensor-parallel-size", type=int, default=2)
    ap.add_argument("--tokens", default="16,256", help="comma list of token counts")
    ap.add_argument("--hidden-size", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--inter", type=int, default=256, help="stand-ins' width, over all ranks")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", help="write the checks and times here")
    args = ap.parse_args(argv)
    tp = args.tensor_parallel_size
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        ap.error(f"--tokens: expected a comma list of integers, got {args.tokens!r}")
    for name, value, least in (
        ("-tp", tp, 2),
        ("--tokens", min(tokens), 1),
        ("--hidden-size", args.hidden_size, 1),
        ("--layers", args.layers, 1),
        ("--repeats", args.repeats, 1),
        ("--warmup", args.warmup, 0),
    ):
        if value < least:
            ap.error(f"{name}: expected at least {least}, got {value}")
    if args.inter < tp or args.inter % tp:
        ap.error(f"--inter: expected a positive multiple of -tp ({tp}), got {args.inter}")
    cases = [(t, sharded) for t in tokens for sharded in (True, False)]
    ranks = measure(tp, cases, args.hidden_size, args.layers, args.inter, args.warmup, args.repeats)
    rows = report(ranks, args.hidden_size, args.layers, args.inter)
    if args.json:
        command = " ".join(["python examples/engine_layer.py", *(argv or sys.argv[1:])])
        with open(args.json, "w") as f:
            json.dump(
                {"command": command, "tp": tp, "layers": args.layers, "rows": rows}, f, indent=1
            )
            f.write("\n")
    return 0 if all(r["mhc_sp collectives bitwise"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
