# SPDX-License-Identifier: Apache-2.0
"""The fused ops on CUDA with mhc_sp's NCCL communicator, and its teardown (skipped without a GPU).

The NCCL path has not run on a GPU yet: these tests are written for a machine with 2 and 4 GPUs
and wait for one. Worlds of 2 and 4 run when there are that many GPUs, or when the installed NCCL
lets ranks share one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL >= 2.30); on a machine with one GPU
only the worlds of one run (no communicator: a world of one exchanges nothing), and the others
skip with "N ranks need N GPUs ...", which bench/gpu_check.sh counts as a hardware skip there.
Teardown: destroy() destroys the communicators, and its exit hook does the same for a process that
ends without calling it (the CPU transports' teardown is tested in
tests/transport/test_teardown.py)."""

import os
import textwrap

import pytest
import torch

from mhc_sp import ops
from mhc_sp.local_world import run_world
from mhc_sp.testing import pre_weights, random_inputs
from tests.helpers.boundaries import boundary_cases, worker_fused_ops
from tests.helpers.reporting_ranks import run_reporting_ranks

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


def skip_unless_ranks_fit(world):
    if not ranks_fit(world):
        pytest.skip(
            f"{world} ranks need {world} GPUs or NCCL_MULTI_RANK_GPU_ENABLE=1 with NCCL >= 2.30"
        )


@pytest.mark.parametrize("world", [1, 2, 4])
def test_fused_ops_on_nccl_match_reference(world):
    skip_unless_ranks_fit(world)
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
    skip_unless_ranks_fit(world)
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
    skip_unless_ranks_fit(2)
    assert run_world(2, worker_cpu_only_group, backend="cpu:gloo,cuda:nccl", timeout=120) == [
        True,
        True,
    ]


def worker_destroy_and_init_again(rank, world):
    """destroy() destroys the group's communicator (the group is forgotten), a new init makes a new
    one that works, and destroy() again leaves nothing."""
    import mhc_sp.distributed as msd

    dev = torch.device("cuda", torch.cuda.current_device())
    for _ in range(2):
        group = msd.init(device="cuda", transport="nccl")
        assert msd.transport(group, "cuda") == "nccl"
        got = ops.all_reduce(torch.ones(4, 8, device=dev), group)
        assert torch.equal(got.cpu(), torch.full((4, 8), float(world)))
        torch.cuda.synchronize()
        msd.destroy()
        with pytest.raises(ValueError, match="is not initialised with mhc_sp"):
            msd.transport(group, "cuda")
    return True


def test_destroy_then_init_again_on_nccl():
    skip_unless_ranks_fit(2)
    assert run_world(
        2, worker_destroy_and_init_again, backend="cpu:gloo,cuda:nccl", timeout=180
    ) == [True, True]


# A rank that ends without destroy(): the exit hook destroys its NCCL communicator while the CUDA
# runtime is alive, and the process exits cleanly and promptly. The check, registered before
# mhc_sp is imported, runs after the hook.
EXITING_NCCL_RANK = textwrap.dedent(
    """
    import atexit, json, os
    import torch
    import torch.distributed as dist

    state = {}

    def report():
        from mhc_sp import _C
        try:
            _C.group_transport(state["group"], "cuda")
            state["registered_at_exit"] = True
        except ValueError:
            state["registered_at_exit"] = False
        print("REPORT " + json.dumps(state), flush=True)

    atexit.register(report)
    import mhc_sp  # registers mhc_sp.distributed's exit hook
    import mhc_sp.distributed as msd
    from mhc_sp import ops

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("cpu:gloo,cuda:nccl")
    state["group"] = msd.init(device="cuda", transport="nccl")
    x = ops.all_reduce(torch.ones(4, 8, device="cuda"), state["group"])
    torch.cuda.synchronize()
    state["sum"] = float(x[0, 0])
    """
)


def test_exit_hook_destroys_the_nccl_communicator():
    skip_unless_ranks_fit(2)
    reports = run_reporting_ranks(EXITING_NCCL_RANK)
    assert [r["sum"] for r in reports] == [2.0, 2.0]
    assert [r["registered_at_exit"] for r in reports] == [False, False]
