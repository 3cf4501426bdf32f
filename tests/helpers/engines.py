# SPDX-License-Identifier: Apache-2.0
"""The small model the runner's tests serve (ModelConfig.tiny()) and the engine configurations
they build around it, one keyword per knob. Used by tests/model/test_runner.py, by the shm
transport's model check (tests/transport/test_shm.py) and by the separate hosts' tp x pp
scenario (hosts.py)."""

from mhc_sp.engine.config import CompilationConfig, EngineConfig, ModelConfig, ParallelConfig

TINY = ModelConfig.tiny()


def engine(
    tp,
    sp=None,
    max_graph=0,
    eager=False,
    pp=1,
    model=TINY,
    spec=0,
    backend="naive",
):
    return EngineConfig(
        model,
        ParallelConfig(tp, pp, sp),
        CompilationConfig(max_cudagraph_capture_size=max_graph),
        enforce_eager=eager,
        moe_backend=backend,
        num_speculative_tokens=spec,
    )
