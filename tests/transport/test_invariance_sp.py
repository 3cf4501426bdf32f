# SPDX-License-Identifier: Apache-2.0
"""Sharded and replicated boundaries give bitwise equal rows (docs/design.md §3b): a rank's shard
of the stream goes through the same kernels as the replicated run's rows, in a call of another
size (decode-size shards take the split-hidden path, the replicated call token blocks), and the
reduced partial is the same rank-order fp32 sum either way. One spawned world of 4 ranks covers
tp = 2, 3 and 4 with subgroups."""

import pytest
import torch

from mhc_sp import ops
from mhc_sp import reference as R
from mhc_sp.local_world import run_world
from mhc_sp.testing import head_weights, pre_weights, random_inputs, stream_inputs

pytestmark = pytest.mark.distributed

TP = (2, 3, 4)
TOKENS = (3, 7, 32)
N, H = 4, 1040  # eight full 128-wide leaves and a 16-wide one


def shard_rows(t: torch.Tensor, rank: int, world: int) -> slice:
    rows = -(-t.shape[0] // world)
    return slice(rank * rows, (rank + 1) * rows)


def check_equal(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
    assert torch.equal(a, b), f"{what}: {(a.float() - b.float()).abs().max().item():.3g} apart"


def worker_sharded_equals_replicated(rank, world):
    import torch.distributed as dist

    import mhc_sp.distributed as msd

    groups = {
        tp: (dist.new_group(list(range(tp)), backend="gloo") if tp < world else None) for tp in TP
    }
    checked = 0
    for tp in TP:
        if rank >= tp:
            continue
        group = msd.init(groups[tp], device="cpu")
        for T in TOKENS:
            tag = f"[tp={tp} rank={rank} T={T}]"
            i = random_inputs(T, N, H, seed=tp * 100 + T)
            g = torch.Generator().manual_seed(tp * 1000 + T * 10 + rank)
            partial = torch.randn(T, H, generator=g).to(torch.bfloat16)  # this rank's own
            shard = {k: R.shard_tokens(i[k], rank, tp) for k in ("residual", "post", "comb", "x")}
            own = shard_rows(R.shard_tokens(i["residual"], 0, 1), rank, tp)  # padded row range
            valid = slice(own.start, min(own.stop, T))
            n_valid = max(0, valid.stop - valid.start)

            rep = ops.fused_layer(partial, *stream_inputs(i), *pre_weights(i), group, False, T)
            sp = ops.fused_layer(partial, *stream_inputs(shard), *pre_weights(i), group, True, T)
            for name, a, b in zip(("residual_out", "post_out", "comb_out"), sp[:3], rep[:3]):
                check_equal(a[:n_valid], b[valid], f"{tag} fused_layer {name}")
            check_equal(sp[3], rep[3], f"{tag} fused_layer layer_input")

            rep = ops.fused_head(partial, *stream_inputs(i), *head_weights(i), group, False, T)
            sp = ops.fused_head(partial, *stream_inputs(shard), *head_weights(i), group, True, T)
            check_equal(sp[0], rep[0], f"{tag} fused_head hidden")
            check_equal(sp[1][:n_valid], rep[1][valid], f"{tag} fused_head residual_out")

            rep = ops.fused_entry(i["x"], *pre_weights(i), group, False)
            sp = ops.fused_entry(i["x"], *pre_weights(i), group, True)
            for name, a, b in zip(("residual", "post", "comb"), sp[:3], rep[:3]):
                check_equal(a[:n_valid], b[valid], f"{tag} fused_entry {name}")
            check_equal(sp[3], rep[3], f"{tag} fused_entry layer_input")
            checked += 1
    return checked


def test_sharded_rows_equal_replicated_rows_bitwise():
    counts = run_world(4, worker_sharded_equals_replicated, start="forkserver")
    assert counts == [len(TOKENS) * sum(1 for tp in TP if r < tp) for r in range(4)]
