# SPDX-License-Identifier: Apache-2.0
"""One sequence-parallel sublayer boundary, the way an engine drives it.

    torchrun --nproc-per-node 2 examples/sp_boundary.py                    # CPU, shared memory
    torchrun --nproc-per-node 2 examples/sp_boundary.py --transport gloo   # CPU, gloo
    torchrun --nproc-per-node 2 examples/sp_boundary.py --device cuda      # NCCL, one GPU per rank

Every rank starts from the same replicated embedding output, keeps only its token shard of the
mHC stream, and ends with the full `layer_input` for the next (tensor-parallel) sublayer. The
result is checked against mhc_sp.reference run on the full tensors.
"""

import argparse
import os

import torch
import torch.distributed as dist

import mhc_sp.distributed as msd
from mhc_sp import ops
from mhc_sp import reference as R
from mhc_sp.testing import assert_close, random_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tokens", type=int, default=37)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument(
        "--transport", default="auto", help="cpu: auto, shm, gloo; cuda: auto, symm, nccl"
    )
    args = ap.parse_args()

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("gloo" if args.device == "cpu" else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    # Registers WORLD with mhc_sp: on CPU "auto" picks shared memory when every rank is on this
    # host (gloo otherwise); on CUDA it creates mhc_sp's NCCL communicator.
    group = msd.init(device=args.device, transport=args.transport)
    device = (
        torch.device(args.device, torch.cuda.current_device())
        if args.device == "cuda"
        else torch.device("cpu")
    )

    T, H = args.tokens, args.hidden
    i = random_inputs(T, 4, H, seed=0, device=device)  # weights and inputs, same on every rank

    # First boundary: the embedding output is replicated; each rank keeps ceil(T / world) rows of
    # the stream and gets the full attention input back.
    residual, post, comb, attn_in = ops.fused_entry(
        i["x"], i["fn"], i["scale"], i["base"], i["norm_weight"], group, sharded=True
    )
    assert residual.shape[0] == -(-T // world) and attn_in.shape == (T, H)

    # A row-parallel sublayer returns an un-reduced partial (T, H) on every rank.
    partial = (attn_in.float() * (rank + 1) / world).to(torch.bfloat16)

    # The boundary: reduce-scatter -> post -> pre (+ next sublayer's RMSNorm) -> all-gather.
    residual, post, comb, ffn_in = ops.fused_layer(
        partial,
        residual,
        post,
        comb,
        i["fn"],
        i["scale"],
        i["base"],
        i["norm_weight"],
        group,
        sharded=True,
        num_tokens=T,
    )

    # Check against the single-process reference of the same flow.
    cpu = lambda t: t.cpu()  # noqa: E731
    full = {k: cpu(v) for k, v in i.items()}
    entry = R.fused_entry(
        full["x"], full["fn"], full["scale"], full["base"], full["norm_weight"], world, True
    )
    partials = [(entry[0][3].float() * (r + 1) / world).to(torch.bfloat16) for r in range(world)]
    expected = R.fused_layer(
        partials,
        [e[0] for e in entry],
        [e[1] for e in entry],
        [e[2] for e in entry],
        full["fn"],
        full["scale"],
        full["base"],
        full["norm_weight"],
        True,
        T,
    )[rank]
    assert_close(cpu(ffn_in), expected[3], "layer_input")
    assert_close(cpu(residual), expected[0], "residual")
    print(
        f"rank {rank}/{world} ({msd.transport(group, args.device)}): stream shard "
        f"{tuple(residual.shape)}, layer_input {tuple(ffn_in.shape)}: OK"
    )
    msd.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
