# SPDX-License-Identifier: Apache-2.0
"""examples/engine_layer.py on a world of 2: the DeepSeek-V4 decoder layer written as the engine
writes it (reduce-scatter / all-reduce after each row-parallel sublayer, the fused mHC post + pre,
all-gather before the next) gives bitwise the residual stream, layer inputs, hidden state and
final stream of the same layers on mhc_sp's fused ops when its collectives are mhc_sp's, and
agrees within the bf16 tolerance when they are torch.distributed's; sharded, replicated and a
one-token decode. The run also prints the three ways' times side by side."""

import io

import pytest
import torch

from examples import engine_layer as E
from mhc_sp.testing import assert_close
from tests.helpers.boundaries import same_bits

TP, H, LAYERS, INTER = 2, 256, 3, 64
CASES = [(10, True), (10, False), (1, False)]


@pytest.fixture(scope="module")
def world():
    """One world of TP ranks for every test here: each case traced, checked and timed."""
    return E.measure(
        TP, CASES, H, LAYERS, INTER, warmup=1, repeats=2, keep_traces=True, start="forkserver"
    )


def traces(ranks, case):
    return [torch.load(io.BytesIO(r["traces"][case])) for r in ranks]


@pytest.mark.distributed
def test_engine_layout_matches_the_fused_layers(world):
    for case in CASES:
        tokens, sharded = case
        per_rank = traces(world, case)
        rows = tokens // TP if sharded else tokens
        for rank, t in enumerate(per_rank):
            fused = t["stacks"]["mhc_sp fused"]
            mine = t["stacks"]["engine, mhc_sp collectives"]
            torch_dist = t["stacks"]["engine, torch.distributed"]
            assert len(fused) == 2 * LAYERS + 1 == len(mine) == len(torch_dist)
            for i, ((res, li), (res_e, li_e), (res_t, li_t)) in enumerate(
                zip(fused[:-1], mine[:-1], torch_dist[:-1])
            ):
                where = f"case {case} rank {rank} boundary {i}"
                assert res.shape == (rows, 4, H) and li.shape == (tokens, H), where
                assert same_bits(res_e, res) and same_bits(li_e, li), where
                assert_close(res_t, res, f"{where} residual (torch.distributed)")
                assert_close(li_t, li, f"{where} layer_input (torch.distributed)")
            (hidden, final), (hidden_e, final_e), (hidden_t, final_t) = (
                fused[-1],
                mine[-1],
                torch_dist[-1],
            )
            assert hidden.shape == (tokens, H) and final.shape == (tokens, 4 * H)
            assert same_bits(hidden_e, hidden) and same_bits(final_e, final), case
            assert_close(hidden_t, hidden, f"case {case} hidden (torch.distributed)")
            assert_close(final_t, final, f"case {case} final stream (torch.distributed)")
            # The layers did something: the stream moves from boundary to boundary.
            assert not torch.equal(fused[0][0], fused[-2][0])
        # Gathered tensors are the same on every rank.
        for a, b in zip(
            per_rank[0]["stacks"]["mhc_sp fused"], per_rank[1]["stacks"]["mhc_sp fused"]
        ):
            assert same_bits(a[1], b[1])


@pytest.mark.distributed
def test_sharded_stream_is_the_replicated_one_split_by_tokens(world):
    """The engine layout keeps mhc_sp's contract: the two ranks' rows of a sharded forward are
    bitwise the rows of the replicated forward of the same tokens."""
    sharded, replicated = traces(world, (10, True)), traces(world, (10, False))
    for i, (full, _) in enumerate(replicated[0]["stacks"]["engine, mhc_sp collectives"][:-1]):
        rows = [t["stacks"]["engine, mhc_sp collectives"][i][0] for t in sharded]
        assert same_bits(torch.cat(rows), full), f"boundary {i}"


@pytest.mark.distributed
def test_entry_agrees_with_fused_entry(world):
    """The engine's entry (expand to n streams, chunk, mhc_pre, gather) against fused_entry:
    within tolerance (fused_entry projects with fn summed over its n blocks: docs/design.md §1)."""
    for case in CASES:
        for t in traces(world, case):
            engine, fused = t["entries"]["engine, mhc_sp collectives"], t["entries"]["mhc_sp fused"]
            assert same_bits(engine[0], fused[0]), "the expanded stream"
            for what, a, b in zip(("post", "comb", "layer_input"), engine[1:], fused[1:]):
                assert_close(a.reshape(b.shape), b, f"{case} entry {what}")


@pytest.mark.distributed
def test_the_run_prints_the_times_side_by_side(world, capsys):
    rows = E.report(world, H, LAYERS, INTER)
    out = capsys.readouterr().out
    header = out.splitlines()[1]
    for name in (*E.STACKS, "sublayers", "speedup"):
        assert name in header
    assert len(rows) == len(CASES)
    for row in rows:
        assert row["mhc_sp collectives bitwise"] and row["torch.distributed within tolerance"]
        times = row["ms_per_layer"]
        assert all(times[w] > 0 for w in (*E.STACKS, "sublayers only"))
