# SPDX-License-Identifier: Apache-2.0
"""One sublayer boundary, as the commands that time it (``tune``, ``layer``) build it on each
rank: its ways (fused sharded, fused replicated, the sharded work as separate ops, and the math
alone) on seeded inputs, and the check that the ranks and transports asked for can run here."""

from __future__ import annotations

import torch

from .. import reference as R
from ..testing import random_inputs
from . import checks, machine

#: The ways :func:`boundary_paths` runs a boundary.
PATHS = ("fused_sharded", "fused_replicated", "separate_sharded", "math_alone")


def boundary_paths(i: dict, partial, rank: int, world: int, group: str, T: int) -> dict:
    """The three ways to run one boundary and its floor, as zero-argument callables on this
    rank."""
    from .. import ops

    shard = {k: R.shard_tokens(i[k], rank, world) for k in ("residual", "post", "comb")}
    w, proj = i["norm_weight"], (i["fn"], i["scale"], i["base"])
    x_own = R.shard_tokens(partial[:T], rank, world)  # as many rows as the reduced shard

    def separate():
        x = ops.reduce_scatter(partial[:T], group)
        residual, post, comb, layer_input = ops.mhc_post_pre(
            x, shard["residual"], shard["post"], shard["comb"], *proj, w
        )
        return residual, post, comb, ops.all_gather(layer_input, group, T)

    return {
        "fused_sharded": lambda: ops.fused_layer(
            partial, shard["residual"], shard["post"], shard["comb"], *proj, w, group, True, T
        ),
        "fused_replicated": lambda: ops.fused_layer(
            partial, i["residual"], i["post"], i["comb"], *proj, w, group, False, T
        ),
        "separate_sharded": separate,
        "math_alone": lambda: ops.mhc_post_pre(
            x_own, shard["residual"], shard["post"], shard["comb"], *proj, w
        ),
    }


def boundary_case(T: int, H: int, n: int, rank: int, world: int, group: str, device) -> dict:
    """Seeded inputs of one boundary of T tokens on this rank, as :func:`boundary_paths`."""
    i = random_inputs(T, n, H, seed=0, device=device)
    gen = torch.Generator().manual_seed(1 + rank)
    partial = torch.randn(T, H, generator=gen).to(device=device, dtype=torch.bfloat16)
    return boundary_paths(i, partial, rank, world, group, T)


def check_ranks(prog: str, device: str, ranks: int, transports) -> None:
    """Enough GPUs for the ranks, and transports that serve the device."""
    from ..distributed import TRANSPORTS

    if device == "cuda" and ranks > machine.gpu_count():
        checks.usage_error(
            prog,
            f"--tensor-parallel-size {ranks} needs that many GPUs, found {machine.gpu_count()} "
            f"(without --device, CPU ranks run instead)",
        )
    for t in [transports] if isinstance(transports, str) else transports:
        if t not in TRANSPORTS[device]:
            checks.usage_error(
                prog,
                f"--transport {t}: does not serve {device} ranks; choose from "
                f"{', '.join(TRANSPORTS[device])}",
            )
