# SPDX-License-Identifier: Apache-2.0
"""The GPU against the emulated device (docs/emulation.md) on the same inputs: every math op's CUDA
outputs equal the emulation's at the contract's tolerances. Where they differ in bits, that is
the tensor cores' rounding and nvcc's FMA contraction, which the emulation does not copy; the
count of such elements is printed for the GPU check's record. Skipped without a GPU or without
the emulation module (MHC_SP_TESTING=1)."""

import pytest
import torch

from mhc_sp.testing import OPS, check_outputs, load_emulated_module, random_inputs

E = load_emulated_module()
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or E is None,
    reason="needs a GPU and the emulated device (a build with MHC_SP_TESTING=1)",
)


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("T,n,H", [(1, 4, 4096), (16, 4, 512), (40, 4, 96), (9, 2, 77)])
def test_gpu_matches_the_emulation(name, T, n, H):
    info = OPS[name]
    sample = info.sample(random_inputs(T, n, H, seed=T + n + H))
    emulated = getattr(E, name)(*info.schema_args(sample))
    emulated = emulated if isinstance(emulated, tuple) else (emulated,)
    on_gpu = info.sample({k: v.cuda() for k, v in random_inputs(T, n, H, seed=T + n + H).items()})
    gpu = tuple(t.cpu() for t in info.call(on_gpu))
    check_outputs(info, sample, gpu, emulated)
    differ = sum(
        int(
            (
                g.view(torch.int16 if g.element_size() == 2 else torch.int32)
                != e.view(torch.int16 if e.element_size() == 2 else torch.int32)
            ).sum()
        )
        for g, e in zip(gpu, emulated)
    )
    print(f"{name} T={T} n={n} H={H}: {differ} elements differ bitwise from the emulation")
