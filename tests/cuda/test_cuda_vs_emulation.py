# SPDX-License-Identifier: Apache-2.0
"""The GPU against the emulated device (docs/emulation.md) on the same inputs: every math op's CUDA
outputs equal the emulation's at the contract's tolerances. Where they differ in bits, that is
the tensor cores' rounding and nvcc's FMA contraction, which the emulation does not copy; the
count of such elements is printed as a "record: " line, which the GPU check's summary keeps. The
harness's multi-rank kernels are compared too. Skipped without a GPU or without the emulation
module (MHC_SP_TESTING=1)."""

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
    print(f"record: {name} T={T} n={n} H={H}: {differ} elements differ bitwise from the emulation")


def differing(a, b):
    """How many elements of two same-shaped tensors differ in bits."""
    ints = {2: torch.int16, 4: torch.int32}
    return int((a.view(ints[a.element_size()]) != b.view(ints[b.element_size()])).sum())


@pytest.mark.parametrize("tp", [2, 4])
def test_the_gpu_harness_matches_the_emulated_harness(tp):
    """The harness's multi-rank kernels (testing/symm_sim.cu) on the GPU and on the emulated
    device, same inputs: the collectives are bitwise equal (rank-order fp32 sums on both), the
    fused boundaries equal at the contract's tolerances (their math is the ops' math above)."""
    from mhc_sp.testing import assert_bitwise, assert_close, load_testing_module
    from tests.emulated.symm_world import Boundary, C

    testing = load_testing_module()
    groups = {
        "gpu": testing.SymmSimGroup(tp, 0, C["default_mailbox_slot_bytes"], 1 << 20, 5.0),
        "emulated": E.SymmSimGroup(tp, 0, C["default_mailbox_slot_bytes"], 1 << 20, 5.0),
    }
    on = {"gpu": lambda ts: [t.cuda() for t in ts], "emulated": lambda ts: ts}
    g = torch.Generator().manual_seed(tp)
    xs = [torch.randn(5 * tp + 3, 96, generator=g).to(torch.bfloat16) for _ in range(tp)]
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        got = {k: [t.cpu() for t in s.collective(op, on[k](xs))] for k, s in groups.items()}
        for r, (a, b) in enumerate(zip(got["gpu"], got["emulated"])):
            assert_bitwise(f"{op} rank {r}", a, b)
    for T, sharded in ((3, False), (16, False), (2 * tp + 1, True)):
        b = Boundary(tp, T, sharded, seed=T)
        rest = b.harness_rest()
        got = {}
        for k, s in groups.items():
            lists = [on[k](ts) for ts in (b.partials, *b.rank_streams())]
            args = [t.cuda() if k == "gpu" and isinstance(t, torch.Tensor) else t for t in rest]
            got[k] = [[t.cpu() for t in out] for out in s.fused_layer(*lists, *args)]
        differ = 0
        for r, (a, e) in enumerate(zip(got["gpu"], got["emulated"])):
            for name, x, y in zip(("residual_out", "post", "comb", "layer_input"), a, e):
                assert_close(x, y, f"tp {tp} T {T} rank {r} {name}")
                differ += differing(x, y)
        side = "sharded" if sharded else "replicated"
        print(f"record: harness tp={tp} T={T} {side}: {differ} elements differ bitwise")
