# SPDX-License-Identifier: Apache-2.0
"""mhc_sp's CPU kernels against a peer build of the engines' own CPU mHC kernels.

The peer library is sglang's ``hc_pre_fused_cpu`` / ``hc_post_fused_cpu`` / ``hc_head_fused_cpu``
(vLLM's CPU backend vendors the same kernels), built separately for AVX2 and registered under the
``sgl_peer`` op namespace; its path is given on the command line. Both run in this process, on
the same tensors, with the same thread count; calls are timed in interleaved bursts
(``mhc_sp.bench.timing.time_calls``), and the whole comparison is repeated ``--trials`` times: the
ratio reported is the median over trials of (peer median / mhc_sp median) of one trial.

The peer's pre has no fused RMSNorm, a post multiplier fixed at 2 and one eps for pre and
Sinkhorn, so mhc_sp runs without ``norm_weight`` and with those constants: the same math.
``post_pre`` is mhc_sp's one-pass ``mhc_post_pre`` against the peer's post followed by its pre.

    python bench/cpu_vs_peer.py --peer-lib PATH/libsgl_peer_mhc.so \\
        --json bench/results/cpu_vs_peer.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys

import torch

import mhc_sp
from mhc_sp import ops
from mhc_sp.bench.timing import time_calls
from mhc_sp.config import MhcConfig
from mhc_sp.testing import BF16_TOL, random_inputs

SHAPES = [(256, 4096), (16, 7168), (1, 4096)]
OPS = ["post", "pre", "post_pre", "head"]
CFG = MhcConfig()  # V4 constants: hc_pre_eps == hc_sinkhorn_eps, hc_post_mult == 2


def calls(i: dict, peer, n: int) -> dict:
    """op -> (mhc_sp call, peer call) on the inputs ``i``."""
    eps, iters = CFG.hc_pre_eps, CFG.sinkhorn_iters

    def peer_pre(residual):
        return peer.hc_pre_fused_cpu(
            residual, i["fn"], i["scale"], i["base"], n, iters, CFG.rms_eps, eps
        )

    def peer_post():
        return peer.hc_post_fused_cpu(i["x"], i["residual"], i["post"], i["comb"])

    return {
        "post": (lambda: ops.mhc_post(i["x"], i["residual"], i["post"], i["comb"]), peer_post),
        "pre": (
            lambda: ops.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], None, CFG),
            lambda: peer_pre(i["residual"]),
        ),
        "post_pre": (
            lambda: ops.mhc_post_pre(
                i["x"],
                i["residual"],
                i["post"],
                i["comb"],
                i["fn"],
                i["scale"],
                i["base"],
                None,
                CFG,
            ),
            lambda: peer_pre(peer_post()),
        ),
        "head": (
            lambda: ops.hc_head(i["residual"], i["head_fn"], i["head_scale"], i["head_base"], CFG),
            lambda: peer.hc_head_fused_cpu(
                i["residual"],
                i["head_fn"],
                i["head_scale"],
                i["head_base"],
                CFG.hc_eps,
                CFG.rms_eps,
            ),
        ),
    }


def check_same_math(op: str, ours, theirs) -> float:
    """Largest difference of the bf16 outputs (mhc_sp vs peer), after checking both against the
    contract's tolerance: a timing of different math would be meaningless."""
    ours = ours if isinstance(ours, tuple) else (ours,)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    a = ours[{"post": 0, "pre": 2, "post_pre": 3, "head": 0}[op]]
    b = theirs[0]
    torch.testing.assert_close(a.float(), b.float(), **BF16_TOL)
    return (a.float() - b.float()).abs().max().item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-lib", required=True, help="the peer's shared library (sgl_peer ops)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trials", type=int, default=5, help="repeats of the whole comparison")
    ap.add_argument("--repeats", type=int, default=40, help="timed calls per callable per trial")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument(
        "--shapes",
        default=",".join(f"{T}x{H}" for T, H in SHAPES),
        help="TxH,... (tokens x hidden)",
    )
    ap.add_argument("--json", help="write the table here")
    args = ap.parse_args(argv)

    torch.ops.load_library(args.peer_lib)
    peer = torch.ops.sgl_peer
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    names = args.ops.split(",")
    rows = []
    for T, H in (map(int, s.split("x")) for s in args.shapes.split(",")):
        i = random_inputs(T, CFG.hc_mult, H, seed=T + H)
        pairs = calls(i, peer, CFG.hc_mult)
        for op in names:
            ours, theirs = pairs[op]
            diff = check_same_math(op, ours(), theirs())
            ratios, ours_us, peer_us = [], [], []
            for _ in range(args.trials):
                t = time_calls(
                    {"mhc_sp": ours, "peer": theirs}, cpu, warmup=3, repeats=args.repeats
                )
                ours_us.append(t["mhc_sp"].median * 1e6)
                peer_us.append(t["peer"].median * 1e6)
                ratios.append(t["peer"].median / t["mhc_sp"].median)
            row = dict(
                op=op,
                tokens=T,
                hidden=H,
                mhc_sp_us=statistics.median(ours_us),
                peer_us=statistics.median(peer_us),
                ratio=statistics.median(ratios),
                ratio_min=min(ratios),
                ratio_max=max(ratios),
                max_abs_diff=diff,
            )
            rows.append(row)
            print(
                f"{op:9s} T={T:4d} H={H:5d}  mhc_sp {row['mhc_sp_us']:9.1f} us  "
                f"peer {row['peer_us']:9.1f} us  peer/mhc_sp {row['ratio']:.2f}x "
                f"[{row['ratio_min']:.2f}, {row['ratio_max']:.2f}]",
                flush=True,
            )
    if args.json:
        command = "python bench/cpu_vs_peer.py --peer-lib PEER_LIB " + " ".join(
            a
            for a in (argv if argv is not None else sys.argv[1:])
            if a != args.peer_lib and a != "--peer-lib"
        )
        out = dict(
            kind="cpu_vs_peer",
            command=command.strip(),
            environment=dict(
                torch=torch.__version__,
                python=platform.python_version(),
                machine=platform.machine(),
                cpu_count=os.cpu_count(),
                threads=args.threads,
                GLIBC_TUNABLES=os.environ.get("GLIBC_TUNABLES"),
                mhc_sp_build=mhc_sp.build_info(),
            ),
            rows=rows,
        )
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
