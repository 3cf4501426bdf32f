# SPDX-License-Identifier: Apache-2.0
"""Every fused boundary and collective of one case on a real group of ranks: checked against
mhc_sp.reference computed on the full tensors in one process (run_case), and bit for bit against
the single-device ops given reference.sum_partials, the rank-order sum (check_rank_order_bitwise,
and check_wide_range_sums on inputs where the order of the terms matters). worker_fused_ops runs
a list of cases (boundary_cases by default) on every transport of the group, as a rank of a
world. The tests of the transports run it: shm and gloo (tests/transport/test_sp_ops.py,
test_world8.py), symm and NCCL (test_symm.py, tests/cuda/), separate hosts (hosts.py)."""

import hashlib

import torch

from mhc_sp import ops
from mhc_sp import reference as R
from mhc_sp.config import MhcConfig
from mhc_sp.testing import assert_close, head_weights, pre_weights, random_inputs

CFG = MhcConfig()


def partials_for(world, rows, H, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, H, generator=g).to(torch.bfloat16) for _ in range(world)]


class RankRows:
    """The rows each rank holds of one boundary call of ``T`` tokens over ``tp`` ranks (set by the
    subclass, with ``sharded``): the simulated-rank cases on a GPU and on the emulated device."""

    def mine(self, full, r):
        """Rank r's rows of a full (T, ...) tensor: its shard, or all of it."""
        return R.shard_tokens(full, r, self.tp).contiguous() if self.sharded else full

    def shard(self):
        return -(-self.T // self.tp) if self.sharded else self.T

    def valid(self, r):
        """Rank r's real (not padding) rows."""
        return max(0, min(self.shard(), self.T - r * self.shard())) if self.sharded else self.T


def symm_collective_cases(tp, H, exchange_rows, generator, device="cpu"):
    """The plain collectives a symm group of tp simulated ranks is checked with, as (op, xs,
    keep, want): each rank's input, all_gather's kept rows (-1: all), and want(r), rank r's
    expected output. all_reduce through the mailbox (3 rows, -0 columns) and through the
    exchange (`exchange_rows`: more than a mailbox slot holds, not a multiple of tp), a
    reduce_scatter whose last shard is short (padded with zeros), all_gather of fp32 rows."""

    def bf16(rows, cols):
        return [
            torch.randn(rows, cols, generator=generator, device=device).to(torch.bfloat16)
            for _ in range(tp)
        ]

    for rows in (3, exchange_rows):
        xs = bf16(rows, H)
        for x in xs:
            x[:, :16] = -0.0
        total = R.sum_partials(xs)
        yield "all_reduce", xs, -1, lambda r, total=total: total
    xs = bf16(5 * tp + 3, H)
    total = R.sum_partials(xs)
    yield "reduce_scatter", xs, -1, lambda r, total=total: R.shard_tokens(total, r, tp)
    xs = [torch.randn(7, H // 2, generator=generator, device=device) for _ in range(tp)]
    for keep in (7 * tp - 3, -1):
        want = torch.cat(xs)[: keep if keep >= 0 else None]
        yield "all_gather", xs, keep, lambda r, want=want: want


def check_absent_rank_named(group, tp, absent, outs):
    """After a call rank `absent` never joined: it recorded nothing, every other rank recorded an
    error, one of them a timeout naming it (described as such), and every output of the failed
    call is NaN, never stale memory."""
    errors = group.errors()
    assert errors[absent] is None, errors
    assert all(errors[r] is not None for r in range(tp) if r != absent), errors
    named = [e for e in errors if e and e["code"] == "timeout" and e["peer"] == absent]
    assert named, f"no rank recorded a timeout naming rank {absent}: {errors}"
    assert f"waiting for rank {absent}" in group.describe_error(named[0]["rank"])
    for r, out in enumerate(outs):
        if r != absent:
            for t in out:
                assert bool(torch.isnan(t.float()).all()), (r, t.shape)


def check_refused_after_absent(group, absent, outs):
    """The next call, every rank there: the workspace is broken, so every rank refused it, the
    late rank recording kPeerBroken (phase 3) naming the rank that broke it, and every output is
    NaN."""
    late = group.errors()[absent]
    assert late is not None and late["code"] == "peer_broken" and late["peer"] != absent, late
    assert late["phase"] == 3 and "refused the call" in group.describe_error(absent)
    for r, out in enumerate(outs):
        for t in out:
            assert bool(torch.isnan(t.float()).all()), (r, t.shape)


#: Transports whose reductions are reference.sum_partials bit for bit (NCCL adds in bf16).
EXACT_TRANSPORTS = ("shm", "gloo", "symm")


def same_bits(a, b):
    """Bitwise equality, signed zeros included (torch.equal takes -0 == +0)."""
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.view(ints[a.element_size()]), b.view(ints[b.element_size()]))


def stream_for(full, rank, world, sharded):
    return R.shard_tokens(full, rank, world) if sharded else full


def padding_rows(t, rank, T):
    """The rows of rank's shard `t` at or past T (the stream's padding)."""
    valid = max(0, min(t.shape[0], T - rank * t.shape[0]))
    return t[valid:]


def check_layer_outputs(got, expected, i, norm_weight, tag, pad=None):
    """pad: (rank, num_tokens) of a sharded stream, whose padding rows must be zeros."""
    residual, post, comb, layer_input = got
    assert_close(residual, expected[0], f"{tag} residual_out")
    # Coefficients against the reference pre of the op's own stream (see tests/ops/test_mhc_ops.py).
    exp_post, exp_comb, _ = R.mhc_pre(residual, i["fn"], i["scale"], i["base"], norm_weight, CFG)
    if pad is not None:
        exp_post, exp_comb = (R.zero_padding(t, *pad) for t in (exp_post, exp_comb))
        for name, t in (("residual_out", residual), ("post", post), ("comb", comb)):
            assert torch.count_nonzero(padding_rows(t, *pad)) == 0, f"{tag} {name} padding rows"
    assert_close(post, exp_post, f"{tag} post_out")
    assert_close(comb, exp_comb, f"{tag} comb_out")
    assert_close(layer_input, expected[3], f"{tag} layer_input")


def boundary_cases(world):
    """(num_tokens, extra partial rows, n, H, sharded, norm) covering odd counts, fewer tokens than
    ranks, one token, zero tokens, a prefill-sized count, and partials padded past num_tokens."""
    cases = []
    for T in sorted({0, 1, world - 1, world + 1, 7, 33, 1000}):
        for sharded in (True, False):
            cases.append((T, 0, 4, 64, sharded, True))
    cases += [
        (13, 3, 4, 96, True, False),
        (10, (-10) % world, 2, 64, True, True),
        (10, 2, 4, 64, False, True),
        (5, 0, 4, 40, True, True),
    ]
    return cases


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def run_case(rank, world, group, device, case_id, case, reference=True):
    """Every fused op and collective of one case on `group`, checked against the reference
    (`reference=False`: only the padding rows and what needs no reference; the callers' bitwise
    checks against the single-device ops cover the rest, and are much cheaper than the reference's
    per-rank work when many ranks share a few cores). Returns this rank's outputs (on the CPU) by
    name."""
    T, extra, n, H, sharded, norm = case
    tag = (
        f"[world={world} rank={rank} T={T} extra={extra} n={n} H={H} sharded={sharded} norm={norm}]"
    )
    on = lambda t: t.to(device)  # noqa: E731
    cpu = lambda ts: [t.cpu() for t in ts]  # noqa: E731
    i = random_inputs(T, n, H, seed=100 + case_id)
    w = i["norm_weight"] if norm else None
    d = {k: on(v) for k, v in i.items()}
    dw = d["norm_weight"] if norm else None
    pad = (rank, T) if sharded else None
    out = {}

    # fused_entry: the embedding output x is replicated.
    got = out["entry"] = cpu(
        ops.fused_entry(d["x"], d["fn"], d["scale"], d["base"], dw, group, sharded)
    )
    if reference:
        exp = R.fused_entry(i["x"], i["fn"], i["scale"], i["base"], w, world, sharded, CFG)[rank]
        assert torch.equal(got[0], exp[0]), tag + " entry residual"
        for name, a, b in zip(("post", "comb", "layer_input"), got[1:], exp[1:]):
            assert_close(a, b, f"{tag} entry {name}")
    if pad is not None:
        for name, t in zip(("residual", "post", "comb"), got[:3]):
            assert torch.count_nonzero(padding_rows(t, *pad)) == 0, f"{tag} entry {name} padding"

    # fused_layer: every rank holds its own un-reduced partial (maybe with padding rows).
    partials = partials_for(world, T + extra, H, seed=200 + case_id)
    residuals = [stream_for(i["residual"], r, world, sharded) for r in range(world)]
    posts = [stream_for(i["post"], r, world, sharded) for r in range(world)]
    combs = [stream_for(i["comb"], r, world, sharded) for r in range(world)]
    mine = [on(t[rank]) for t in (partials, residuals, posts, combs)]  # this rank's, on `device`
    got = out["layer"] = cpu(
        ops.fused_layer(*mine, d["fn"], d["scale"], d["base"], dw, group, sharded, T)
    )
    if reference:
        exp = R.fused_layer(
            partials, residuals, posts, combs, i["fn"], i["scale"], i["base"], w, sharded, T, CFG
        )[rank]
        check_layer_outputs(got, exp, i, w, tag + " layer", pad)
    elif pad is not None:
        for name, t in zip(("residual_out", "post", "comb"), got[:3]):
            assert torch.count_nonzero(padding_rows(t, *pad)) == 0, f"{tag} layer {name} padding"

    # fused_head
    got = out["head"] = cpu(ops.fused_head(*mine, *head_weights(d), group, sharded, T))
    if reference:
        exp = R.fused_head(
            partials,
            residuals,
            posts,
            combs,
            *head_weights(i),
            sharded,
            T,
            CFG.rms_eps,
            CFG.hc_eps,
        )[rank]
        assert_close(got[0], exp[0], tag + " head hidden")
        assert_close(got[1], exp[1], tag + " head residual_out")
    if pad is not None:
        assert torch.count_nonzero(padding_rows(got[1], *pad)) == 0, tag + " head padding"

    # The plain collectives.
    rs = out["reduce_scatter"] = ops.reduce_scatter(on(partials[rank]), group).cpu()
    ar = out["all_reduce"] = ops.all_reduce(on(partials[rank]), group).cpu()
    if reference:
        assert_close(rs, R.reduce_scatter(partials)[rank], tag + " reduce_scatter")
        assert_close(ar, R.all_reduce(partials)[rank], tag + " all_reduce")
    shards = [R.shard_tokens(i["x"], r, world) for r in range(world)]
    assert torch.equal(ops.shard_tokens(d["x"], rank, world).cpu(), shards[rank]), tag
    got = ops.all_gather(on(shards[rank]), group, T).cpu()
    assert torch.equal(got, R.all_gather(shards, T)), tag + " all_gather"
    got = ops.all_gather(on(shards[rank]), group).cpu()
    assert torch.equal(got, R.all_gather(shards)), tag + " all_gather(-1)"
    out["inputs"] = (i, partials, residuals[rank], posts[rank], combs[rank], w)
    return out


def run_on(device, op, *args):
    """op on `device` (tensor arguments moved there), its outputs back on the CPU."""
    out = op(*(a.to(device) if isinstance(a, torch.Tensor) else a for a in args))
    return out.cpu() if isinstance(out, torch.Tensor) else [t.cpu() for t in out]


def check_rank_order_bitwise(rank, world, case, out, device):
    """A transport's sums are reference.sum_partials, bit for bit, wherever they are made: the
    plain collectives, and the reduction fused_layer and fused_head fold into their post (whose
    outputs are then those of the single-device ops on `device` given the summed x). fused_entry
    sums nothing: its outputs are mhc_pre_broadcast's of this rank's rows, bit for bit."""
    T, _, _, _, sharded, _ = case
    i, partials, residual, post, comb, w = out["inputs"]
    total = R.sum_partials([p[:T] for p in partials]) if T else partials[0][:0]
    assert same_bits(out["all_reduce"], R.sum_partials(partials))
    assert same_bits(out["reduce_scatter"], R.shard_tokens(R.sum_partials(partials), rank, world))
    x = R.shard_tokens(total, rank, world) if sharded else total
    valid = max(0, min(x.shape[0], T - rank * x.shape[0])) if sharded else T
    start = rank * x.shape[0] if sharded else 0
    own_x = i["x"][start : start + valid]
    entry = run_on(device, ops.mhc_pre_broadcast, own_x, i["fn"], i["scale"], i["base"], w)
    for a, b in zip(out["entry"][:3], entry[:3]):
        assert same_bits(a[:valid], b)
    assert same_bits(out["entry"][3][start : start + valid], entry[3])
    stream = (x[:valid], residual[:valid], post[:valid], comb[:valid])
    alone = run_on(device, ops.mhc_post_pre, *stream, i["fn"], i["scale"], i["base"], w)
    for a, b in zip(out["layer"][:3], alone[:3]):
        assert same_bits(a[:valid], b)
    assert same_bits(out["layer"][3][start : start + valid], alone[3])
    alone_post = run_on(device, ops.mhc_post, *stream)
    assert same_bits(out["head"][1][:valid], alone_post)
    hidden = run_on(device, ops.hc_head, alone_post, *head_weights(i))
    assert same_bits(out["head"][0][start : start + valid], hidden)


def wide_partials(world, rows, H, seed):
    """Partials whose fp32 sum depends on the order of the terms (sums of bf16 values of similar
    size are exact in fp32): magnitudes 2^-12..2^12 apart, and in every row a few columns where
    ranks 0 and 1 cancel a large value and rank 2 adds a normal one (V - V + c = c, while
    c - V + V is c rounded to V's fp32 ulp); columns 8..15 are -0 on every rank (they sum to +0)
    and columns 16..23 +0 on rank 0 and -0 on the others."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(world):
        scale = torch.pow(2.0, torch.randint(-12, 13, (rows, H), generator=g).float())
        out.append(torch.randn(rows, H, generator=g) * scale)
    if world > 2:
        big = torch.randn(rows, 8, generator=g) * 2.0**20
        out[0][:, :8], out[1][:, :8], out[2][:, :8] = big, -big, torch.randn(rows, 8, generator=g)
    out = [p.to(torch.bfloat16) for p in out]
    for r, p in enumerate(out):
        p[:, 8:16] = -0.0
        p[:, 16:24] = 0.0 if r == 0 else -0.0
    return out


def check_wide_range_sums(rank, world, group, device):
    """A transport's sums are reference.sum_partials bit for bit on inputs where the order of the
    terms matters (worlds of 3 and more) and on signed zeros: from +0, -0 + -0 + ... is +0."""
    T, n, H = 2 * world + 3, 4, 64
    partials = wide_partials(world, T, H, seed=31)
    total = R.sum_partials(partials)
    if world > 2:
        assert not torch.equal(total, R.sum_partials(partials[::-1])), "orders give the same sums"
    assert (total[:, 8:24].view(torch.int16) == 0).all(), "signed zeros must sum to +0"
    assert same_bits(run_on(device, ops.all_reduce, partials[rank], group), total)
    shard = R.shard_tokens(total, rank, world)
    assert same_bits(run_on(device, ops.reduce_scatter, partials[rank], group), shard)
    if device.type == "cpu":  # fp32 data, summed in fp32 (symm sums bf16; other dtypes go to NCCL)
        wide32 = [p.float() for p in partials]
        assert same_bits(
            run_on(device, ops.all_reduce, wide32[rank], group), R.sum_partials(wide32)
        )
        assert same_bits(
            run_on(device, ops.reduce_scatter, wide32[rank], group), R.reduce_scatter(wide32)[rank]
        )
    i = random_inputs(T, n, H, seed=32)
    proj = pre_weights(i)
    head_w = head_weights(i)
    alone = run_on(device, ops.mhc_post_pre, total, i["residual"], i["post"], i["comb"], *proj)
    stream = run_on(device, ops.mhc_post, total, i["residual"], i["post"], i["comb"])
    hidden = run_on(device, ops.hc_head, stream, *head_w)
    rows = -(-T // world)
    first, valid = rank * rows, max(0, min(rows, T - rank * rows))
    for sharded in (True, False):
        own = (lambda t: R.shard_tokens(t, rank, world)) if sharded else (lambda t: t)  # noqa: E731
        mine = (partials[rank], own(i["residual"]), own(i["post"]), own(i["comb"]))
        got = run_on(device, ops.fused_layer, *mine, *proj, group, sharded, T)
        lo, hi = (first, first + valid) if sharded else (0, T)
        for a, b in zip(got[:3], alone[:3]):
            assert same_bits(a[: hi - lo], b[lo:hi])
        assert same_bits(got[3], alone[3])
        head = run_on(device, ops.fused_head, *mine, *head_w, group, sharded, T)
        assert same_bits(head[1][: hi - lo], stream[lo:hi])
        assert same_bits(head[0], hidden)


def worker_fused_ops(rank, world, device_type="cpu", transport="auto", cases=None, reference=True):
    """Every fused op and collective on this rank vs the reference (computed on CPU); on CPU on
    the shm and the gloo transport, compared with each other. `cases`: as boundary_cases (its
    cases by default); `reference`: as run_case. Returns (cases checked, digests of the
    replicated cases' outputs, which every rank must share)."""
    import torch.distributed as dist

    import mhc_sp.distributed as msd

    group = msd.init(device=device_type, transport=transport)
    assert msd.rank_and_world(group) == (rank, world)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if device_type == "cuda"
        else torch.device("cpu")
    )
    groups = {msd.transport(group, device_type): group}
    if device_type == "cpu":
        assert msd.transport(group, "cpu") == "shm"
        gloo = msd.init(dist.new_group(list(range(world)), backend="gloo"), "cpu", transport="gloo")
        assert msd.transport(gloo, "cpu") == "gloo"
        groups["gloo"] = gloo
    checked, replicated = 0, []
    exact = [name for name in groups if name in EXACT_TRANSPORTS]
    for case_id, case in enumerate(boundary_cases(world) if cases is None else cases):
        outs = {
            name: run_case(rank, world, g, device, case_id, case, reference)
            for name, g in groups.items()
        }
        for name in exact:
            check_rank_order_bitwise(rank, world, case, outs[name], device)
        if "shm" in outs:  # the same sums and kernels: the CPU transports agree bit for bit
            shm, gloo = outs["shm"], outs["gloo"]
            for op in ("entry", "layer", "head"):
                for a, b in zip(shm[op], gloo[op]):
                    assert same_bits(a, b), f"world {world} case {case}: shm vs gloo {op}"
            for op in ("all_reduce", "reduce_scatter"):
                assert same_bits(shm[op], gloo[op]), f"world {world} case {case}: {op}"
        if not case[4]:
            first = outs[next(iter(groups))]
            replicated.append(digest([*first["layer"], *first["head"], first["all_reduce"]]))
        checked += 1
    for name in exact:
        check_wide_range_sums(rank, world, groups[name], device)
    fp32 = partials_for(world, 9, 8, seed=7)
    fp32 = [p.float() for p in fp32]
    for g in groups.values():
        got = ops.reduce_scatter(fp32[rank].to(device), g).cpu()
        torch.testing.assert_close(got, R.reduce_scatter(fp32)[rank])
    return checked, replicated
