# SPDX-License-Identifier: Apache-2.0
"""The fused ops on CUDA with mhc_sp's NCCL communicator (skipped without a GPU). Worlds of 2 and 4
run when there are that many GPUs, or when the installed NCCL lets ranks share one GPU
(NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL >= 2.30)."""

import os

import pytest
import torch

from dist_harness import run_world
from mhc_sp import ops
from mhc_sp.testing import pre_weights, random_inputs
from test_sp_ops import boundary_cases, worker_fused_ops

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available"),
    pytest.mark.distributed,
]


def ranks_fit(world):
    if torch.cuda.device_count() >= world:
        return True
    shared = os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1" and torch.cuda.nccl.version() >= (
        2,
        30,
    )
    return shared


@pytest.mark.parametrize("world", [1, 2, 4])
def test_fused_ops_on_nccl_match_reference(world):
    if not ranks_fit(world):
        pytest.skip(
            f"{world} ranks need {world} GPUs or NCCL_MULTI_RANK_GPU_ENABLE=1 with NCCL >= 2.30"
        )
    results = run_world(world, worker_fused_ops, "cuda", backend="cpu:gloo,cuda:nccl", timeout=300)
    assert [checked for checked, _ in results] == [len(boundary_cases(world))] * world


def worker_graph_capture(rank, world):
    """fused_layer (NCCL on the current stream) captured in a CUDA graph replays bitwise equal to
    eager."""
    import mhc_sp.distributed as msd

    group = msd.init(device="cuda")
    dev = torch.device("cuda", torch.cuda.current_device())
    T, n, H = 24, 4, 256
    i = {k: v.to(dev) for k, v in random_inputs(T, n, H, seed=3).items()}
    gen = torch.Generator().manual_seed(rank)
    partial = torch.randn(T, H, generator=gen).to(dev, torch.bfloat16)
    shard = {k: ops.shard_tokens(i[k], rank, world) for k in ("residual", "post", "comb")}

    def run():
        return ops.fused_layer(
            partial,
            shard["residual"],
            shard["post"],
            shard["comb"],
            *pre_weights(i),
            group,
            True,
            T,
        )

    eager = run()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = run()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    return all(torch.equal(a, b) for a, b in zip(eager, captured))


@pytest.mark.parametrize("world", [1, 2])
def test_fused_layer_graph_capture(world):
    if not ranks_fit(world):
        pytest.skip("not enough GPUs")
    assert (
        run_world(world, worker_graph_capture, backend="cpu:gloo,cuda:nccl", timeout=300)
        == [True] * world
    )


def worker_cpu_only_group(rank, world):
    import mhc_sp.distributed as msd

    group = msd.init(device="cpu")  # gloo only: no CUDA transport (NCCL or symm)
    x = torch.ones(4, 8, device="cuda")
    with pytest.raises(ValueError, match=r"^x: group '\S+' has no CUDA transport for cuda:\d"):
        ops.all_reduce(x, group)
    return True


def test_cuda_tensor_on_group_without_nccl_raises():
    if not ranks_fit(2):
        pytest.skip("not enough GPUs")
    assert run_world(2, worker_cpu_only_group, backend="cpu:gloo,cuda:nccl", timeout=120) == [
        True,
        True,
    ]
