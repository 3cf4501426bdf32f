# SPDX-License-Identifier: Apache-2.0
"""Simulated symm worlds on the emulated device and the boundary calls the emulated tests make
(tests/emulated/test_emulated_symm.py, test_emulated_run_ahead.py, test_emulated_symm_sim.py):
every rank's inputs, its call of the production op (or the GPU harness's one call for every
rank), and the check of every rank's outputs, bitwise against the emulated math ops over the fp32
rank-order sum of the partials (mhc_sp.reference.sum_partials)."""

import pytest
import torch

from mhc_sp import _C
from mhc_sp import reference as R
from mhc_sp.config import MhcConfig
from mhc_sp.testing import (
    assert_bitwise,
    assert_close,
    head_weights,
    load_emulated_module,
    pre_weights,
    random_inputs,
)
from tests.helpers.boundaries import RankRows

E = load_emulated_module()
N = 4  # hc_mult: V4's
H = 96  # three 32-wide chunks of the projection: several split-K blocks per token tile
CFG = MhcConfig()
C = _C.symm_constants()


def emulated_device(**config):
    """An autouse fixture that configures the emulated devices for a module's tests
    (mhc_sp._emulated.configure) and puts the defaults back after each."""

    @pytest.fixture(autouse=True)
    def device():
        E.configure(**config)
        yield
        E.configure()

    return device


def world(tp, timeout=10.0, devices=()):
    return E.World(tp, C["default_mailbox_slot_bytes"], 1 << 20, timeout, list(devices))


def outputs(results):
    """Every rank's outputs; an exception a rank's call raised is raised here."""
    for r, out in enumerate(results):
        if isinstance(out, Exception):
            raise AssertionError(f"rank {r}: {type(out).__name__}: {out}")
    return results


def no_errors(w):
    errors = [e for e in w.errors() if e is not None]
    assert not errors, f"errors recorded: {errors}"


def all_nan(t):
    return bool(torch.isnan(t.float()).all())


class Boundary(RankRows):
    """One fused_layer (or fused_head) call of tp ranks: shared pre weights, and per rank its own
    partial (T + 2 rows, garbage past T), stream, post and comb (replicated: all T rows; sharded:
    the rank's shard of its own full stream, padding rows zero)."""

    def __init__(self, tp, T, sharded, seed, zeros=False, n=N):
        self.tp, self.T, self.sharded = tp, T, sharded
        self.w = random_inputs(T, n, H, seed=seed)
        g = torch.Generator().manual_seed(seed + 1)
        self.partials, self.streams = [], []
        for r in range(tp):
            own = random_inputs(T, n, H, seed=seed + 10 + r)
            p = torch.randn(T + 2, H, generator=g).to(torch.bfloat16)
            p[T:] = 1e4  # rows past num_tokens must be ignored
            if zeros:  # -0 is the mailbox's empty marker: it must be sent as +0
                p[:T, :16] = -0.0
            self.partials.append(p)
            self.streams.append([self.mine(own[k], r) for k in ("residual", "post", "comb")])

    def layer_call(self, r):
        args = (
            self.partials[r],
            *self.streams[r],
            *pre_weights(self.w),
            None,
            self.sharded,
            self.T,
        )
        return ("fused_layer", (*args, *CFG.scalars()))

    def run_harness(self, sim, **kw):
        """The call on the GPU harness's simulated ranks (SymmSimGroup: every rank in one
        launch)."""
        return sim.fused_layer(self.partials, *self.rank_streams(), *self.harness_rest(), **kw)

    def rank_streams(self):
        """Every rank's residual, post and comb: three lists of tp tensors."""
        return [[s[k] for s in self.streams] for k in range(3)]

    def harness_rest(self):
        """The harness call's arguments after the per-rank lists."""
        return (*pre_weights(self.w), self.sharded, self.T, *CFG.scalars())

    def head_call(self, r):
        args = (self.partials[r], *self.streams[r], *head_weights(self.w), None, self.sharded)
        return ("fused_head", (*args, self.T, CFG.rms_eps, CFG.hc_eps))

    def x(self, r):
        """Rank r's rows of the reduced sublayer output."""
        x = R.sum_partials([p[: self.T] for p in self.partials])
        return (R.shard_tokens(x, r, self.tp) if self.sharded else x)[: self.valid(r)]

    def rows(self, r):
        v = self.valid(r)
        return [t[:v].contiguous() for t in self.streams[r]]

    def check_layer(self, outs, reference=False):
        gathered = []
        for r, out in enumerate(outs):
            v = self.valid(r)
            want = E.mhc_post_pre(self.x(r), *self.rows(r), *pre_weights(self.w), *CFG.scalars())
            for name, got, w in zip(("residual_out", "post", "comb"), out[:3], want[:3]):
                assert_bitwise(f"rank {r} {name}", got[:v], w)
                assert int(torch.count_nonzero(got[v:])) == 0, f"rank {r} {name} padding rows"
            own = E.mhc_pre(out[0][:v].contiguous(), *pre_weights(self.w), *CFG.scalars())
            for name, got, w in zip(("post", "comb"), out[1:3], own[:2]):
                assert_bitwise(f"rank {r} {name} vs mhc_pre(residual_out)", got[:v], w)
            gathered.append(want[3])
            if not self.sharded:
                assert_bitwise(f"rank {r} layer_input", out[3], want[3])
            if reference and v:
                ref = R.mhc_post_pre(self.x(r), *self.rows(r), *pre_weights(self.w), CFG)
                assert_close(out[0][:v], ref[0], f"rank {r} residual_out")
                start = r * self.shard() if self.sharded else 0
                assert_close(out[3][start : start + v], ref[3], f"rank {r} layer_input")
        if self.sharded:
            for r, out in enumerate(outs):
                assert_bitwise(f"rank {r} gathered layer_input", out[3], torch.cat(gathered))

    def check_head(self, outs):
        hidden = []
        for r, out in enumerate(outs):
            v = self.valid(r)
            stream = E.mhc_post(self.x(r), *self.rows(r))
            assert_bitwise(f"rank {r} residual_out", out[1][:v], stream)
            assert int(torch.count_nonzero(out[1][v:])) == 0
            hidden.append(E.hc_head(stream, *head_weights(self.w), CFG.rms_eps, CFG.hc_eps))
        for r, out in enumerate(outs):
            want = torch.cat(hidden) if self.sharded else hidden[r]
            assert_bitwise(f"rank {r} hidden", out[0], want)


def token_counts(tp):
    return sorted({1, max(1, tp - 1), tp + 1, 17, 37})
