# SPDX-License-Identifier: Apache-2.0
"""Real work for tests/cli/test_nvtx.py to record under the recording NVTX tool: run as
``python nvtx_workload.py FOLDER`` with MHC_SP_NVTX_RECORD set (each process writes its events).

1. ``mhc-sp-bench ops --profile nvtx-record`` (in this process, which has made no NVTX call yet:
   the CLI attaches the tool itself); its summary goes to FOLDER/summary.json. ``cli.main``
   called from Python leaves the environment as it found it, so the workload then names the tool
   in its own environment for the ranks it starts later.
2. Every math op, and one with a bad argument.
3. ``mhc-sp-bench layer --profile torch`` on two shm ranks (trace: FOLDER/layer_trace.json).
4. A world of two ranks: the collectives and the fused ops on a shm group and on a gloo group,
   sharded and replicated; a fused op with a bad argument; a model forward with an MTP draft
   step; and last a shm fused_layer whose peer never comes.

Each case of 2 and 4 runs inside a Python phase ``mhc_sp/case <name>`` so that the test finds its
ranges."""

import sys
import time
from pathlib import Path

import torch

from mhc_sp import ops
from mhc_sp import reference as R
from mhc_sp.profiling import phase
from mhc_sp.testing import OPS, head_weights, pre_weights, random_inputs

N, H = 4, 64
PEER_TIMEOUT_S = 1.0


def math_ops() -> None:
    inputs = random_inputs(3, N, H)
    for name, info in OPS.items():
        with phase(f"case math {name}"):
            info.call(info.sample(inputs))
    bad = dict(inputs, x=inputs["x"].float())  # x must be bf16
    with phase("case bad mhc_post_pre"):
        try:
            OPS["mhc_post_pre"].call(OPS["mhc_post_pre"].sample(bad))
        except TypeError:
            pass
        else:
            raise AssertionError("mhc_post_pre took a float32 x")


def fused_cases(rank: int, world: int, transport: str, group: str) -> None:
    T = 5
    i = random_inputs(T, N, H, seed=1)
    partial = random_inputs(T, N, H, seed=2 + rank)["x"]
    for sharded in (True, False):
        how = "sharded" if sharded else "replicated"
        rows = {k: R.shard_tokens(i[k], rank, world) if sharded else i[k] for k in i}
        stream = (rows["residual"], rows["post"], rows["comb"])
        with phase(f"case {transport} fused_entry {how}"):
            ops.fused_entry(i["x"], *pre_weights(i), group, sharded)
        with phase(f"case {transport} fused_layer {how}"):
            ops.fused_layer(partial, *stream, *pre_weights(i), group, sharded, T)
        with phase(f"case {transport} fused_head {how}"):
            ops.fused_head(partial, *stream, *head_weights(i), group, sharded, T)
    with phase(f"case {transport} shard_tokens"):
        ops.shard_tokens(i["x"], rank, world)
    with phase(f"case {transport} all_gather"):
        ops.all_gather(i["x"], group, -1)
    with phase(f"case {transport} reduce_scatter"):
        ops.reduce_scatter(i["x"].float(), group)
    with phase(f"case {transport} all_reduce"):
        ops.all_reduce(i["x"].float(), group)
    # A bad argument: every rank raises in the argument checks, before any exchange.
    with phase(f"case {transport} bad fused_layer"):
        try:
            ops.fused_layer(partial, *stream, *pre_weights(i), group, True, T + 100)
        except ValueError:
            pass
        else:
            raise AssertionError("fused_layer took num_tokens past the partial's rows")


def model_case(rank: int, world: int) -> None:
    from mhc_sp.engine.config import CompilationConfig, EngineConfig, ModelConfig, ParallelConfig
    from mhc_sp.engine.runner import ModelRunner, init_parallel_groups

    engine = EngineConfig(
        ModelConfig.tiny(),
        ParallelConfig(world, 1, 1),  # SP from one token on
        CompilationConfig(max_cudagraph_capture_size=0),
        num_speculative_tokens=1,
    )
    runner = ModelRunner(engine, init_parallel_groups(engine.parallel))
    ids = torch.arange(5)
    with phase("case model"):
        out = runner.forward(ids, return_final_stream=True)
        runner.propose(out.final_stream, ids.roll(-1))


def world_worker(rank: int, world: int) -> None:
    import torch.distributed as dist

    import mhc_sp.distributed as msd

    shm = msd.init(None, device="cpu", transport="shm")
    gloo = msd.init(dist.new_group(list(range(world))), device="cpu", transport="gloo")
    fused_cases(rank, world, "shm", shm)
    fused_cases(rank, world, "gloo", gloo)
    model_case(rank, world)
    # A peer that never comes: rank 0 gives up on its shm group within the timeout and raises.
    lonely = msd.init(
        dist.new_group(list(range(world))), device="cpu", transport="shm", timeout=PEER_TIMEOUT_S
    )
    if rank == 0:
        i = random_inputs(4, N, H, seed=3)
        stream = (R.shard_tokens(i[k], rank, world) for k in ("residual", "post", "comb"))
        start = time.monotonic()
        with phase("case shm timeout fused_layer"):
            try:
                ops.fused_layer(i["x"], *stream, *pre_weights(i), lonely, True, 4)
            except RuntimeError as e:
                assert "rank 1" in str(e), e
            else:
                raise AssertionError("fused_layer returned without its peer")
        assert time.monotonic() - start < 10 * PEER_TIMEOUT_S
    dist.barrier()


def main() -> None:
    from mhc_sp.bench import cli
    from mhc_sp.local_world import run_world
    from mhc_sp.profiling import use_nvtx_recorder

    folder = Path(sys.argv[1])
    ops_argv = ["ops", "--tokens", "4", "--hidden-size", "64", "--compare", "none"]
    ops_argv += ["--ops", "mhc_post_pre,hc_head", "--repeats", "3", "--warmup", "1"]
    ops_argv += ["--profile", "nvtx-record", "--trace", str(folder / "summary.json")]
    assert cli.main(ops_argv) == 0
    use_nvtx_recorder()  # for the ranks started below
    math_ops()
    layer_argv = ["layer", "-tp", "2", "--tokens", "8", "--hidden-size", "64"]
    layer_argv += ["--transport", "shm", "--repeats", "1", "--warmup", "0", "--profile", "torch"]
    layer_argv += ["--trace", str(folder / "layer_trace.json")]
    assert cli.main(layer_argv) == 0
    run_world(2, world_worker, timeout=120)
    print("workload done", file=sys.stderr)


if __name__ == "__main__":
    main()
