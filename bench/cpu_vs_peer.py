# SPDX-License-Identifier: Apache-2.0
"""mhc_sp's CPU kernels against a peer build of the engines' own CPU mHC kernels.

The peer library is sglang's ``hc_pre_fused_cpu`` / ``hc_post_fused_cpu`` / ``hc_head_fused_cpu``
(vLLM's CPU backend vendors the same kernels), registered under the ``sgl_peer`` op namespace:
either a library already built (``--peer-lib``) or built here from its sources (``--peer-src``,
into ``--build-dir``) for ``--peer-isa``: ``avx2`` (the peer's own AVX2 flags) or ``avx512``
(sglang's CPU build flag ``-march=native`` with at::vec's AVX-512 vectors, which its vec.h also
takes for its bf16 conversions). Both run in this process, on the same tensors, with the same
thread count; mhc_sp's kernel table is the one ``MHC_SP_CPU_KERNELS`` forces, or the best the
CPU has. Calls are timed in interleaved bursts (``mhc_sp.bench.timing.time_calls``), and the
whole comparison is repeated ``--trials`` times: the ratio reported is the median over trials of
(peer median / mhc_sp median) of one trial. The JSON rows also hold ``ratio_p10``, the same
ratio of each callable's 10th-percentile time: on a machine shared with a busy neighbour it moves
less than the median, so A/B comparisons of two builds run one after the other read it too.

The peer's pre has no fused RMSNorm, a post multiplier fixed at 2 and one eps for pre and
Sinkhorn, so mhc_sp runs without ``norm_weight`` and with those constants: the same math.
``post_pre`` is mhc_sp's one-pass ``mhc_post_pre`` against the peer's post followed by its pre.

With ``--roofline`` each row also gets mhc_sp's share of the machine's limit: for the pre family
its fp32 FMAs per second against the AVX-512 (or AVX2) FMA peak of ``--threads`` cores, measured
here with a small FMA loop; for ``post`` the time of an out-of-place copy of the bytes it must
move (``mhc_sp.bench.timing.copy_call``, timed beside it) over its own time.

    MHC_SP_CPU_KERNELS=avx512_bf16 python bench/cpu_vs_peer.py --peer-src PEER_SRC \
        --peer-isa avx512 --roofline --json bench/results/cpu_vs_peer_avx512.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import mhc_sp
from mhc_sp import ops
from mhc_sp.bench.timing import copy_call, time_calls
from mhc_sp.config import MhcConfig
from mhc_sp.testing import BF16_TOL, random_inputs

SHAPES = [(256, 4096), (16, 7168), (1, 4096)]
OPS = ["post", "pre", "post_pre", "head"]
CFG = MhcConfig()  # V4 constants: hc_pre_eps == hc_sinkhorn_eps, hc_post_mult == 2

# The peer's compile flags per target: its own build script's for AVX2; for AVX-512 sglang's CPU
# build flag (-march=native) and at::vec's AVX-512 instance, under which the peer's vec.h uses
# vcvtne2ps2bf16 for its bf16 rounding.
PEER_FLAGS = {
    "avx2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"],
    "avx512": ["-march=native", "-DCPU_CAPABILITY_AVX512", "-DCPU_CAPABILITY=AVX512"],
}

# fp32 FMA peak of one instruction set (compiled with -mavx512f or -mavx2 -mfma): 16 independent
# accumulators per thread (more than FMA latency x ports), one FMA per accumulator per step;
# prints the best of 5 runs in FMAs (lanes) per second over all threads.
FMA_LOOP = r"""
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#if defined(__AVX512F__)
using V = __m512;
static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
static V set(float v) { return _mm512_set1_ps(v); }
#else
using V = __m256;
static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
static V set(float v) { return _mm256_set1_ps(v); }
#endif
constexpr int kLanes = sizeof(V) / sizeof(float);
static float run(long steps) {
  V a[16];
  for (int i = 0; i < 16; ++i) a[i] = set(1.0f + i * 1e-3f);
  const V m = set(0.9999999f), c = set(1e-7f);
  for (long k = 0; k < steps; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) a[i] = fma(a[i], m, c);  // unrolled: a[] stays in registers
  }
  float out[16 * kLanes];
  for (int i = 0; i < 16; ++i) std::memcpy(out + i * kLanes, &a[i], sizeof(V));
  float sum = 0;  // every accumulator is used: none of the chains can be dropped
  for (float v : out) sum += v;
  return sum;
}
int main(int argc, char** argv) {
  const int threads = std::atoi(argv[1]);
  const long steps = 1600000000L / kLanes;
  double best = 0;
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<std::thread> pool;
    std::vector<float> sink(threads);
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { sink[t] = run(steps); });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double fmas = double(threads) * steps * 16 * kLanes;
    if (fmas / s > best) best = fmas / s;
    if (sink[0] == 42.f) std::printf("-");
  }
  std::printf("%.6e\n", best);
}
"""


def build_peer(src: Path, isa: str, out: Path) -> Path:
    """The peer's library, compiled from ``src`` (mhc.cpp, register.cpp) for ``isa`` into
    ``out`` against this python's torch; kept from an earlier run while newer than the sources."""
    tdir = Path(torch.__file__).parent
    lib = out / "libsgl_peer_mhc.so"
    newest = max(f.stat().st_mtime for f in src.iterdir() if f.is_file())
    if lib.exists() and lib.stat().st_mtime > newest:
        return lib
    flags = [
        "-std=c++20",
        "-O3",
        "-fPIC",
        "-fopenmp",
        *PEER_FLAGS[isa],
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        "-isystem",
        str(tdir / "include"),
        "-isystem",
        str(tdir / "include/torch/csrc/api/include"),
        "-w",
    ]
    out.mkdir(parents=True, exist_ok=True)
    objects = []
    for name in ("mhc", "register"):
        objects.append(out / f"{name}.o")
        subprocess.check_call(["g++", *flags, "-c", str(src / f"{name}.cpp"), "-o", objects[-1]])
    subprocess.check_call(
        ["g++", "-shared", "-fopenmp", *map(str, objects), "-o", str(lib), f"-L{tdir / 'lib'}"]
        + ["-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{tdir / 'lib'}"]
    )
    return lib


def fma_peak(isa: str, threads: int, out: Path) -> float:
    """fp32 FMAs per second of ``threads`` cores running ``FMA_LOOP`` built for ``isa``."""
    out.mkdir(parents=True, exist_ok=True)
    source, binary = out / "fma_loop.cpp", out / f"fma_loop_{isa}"
    source.write_text(FMA_LOOP)
    isa_flags = ["-mavx512f", "-mfma"] if isa == "avx512" else ["-mavx2", "-mfma"]
    subprocess.check_call(["g++", "-O3", "-pthread", *isa_flags, str(source), "-o", str(binary)])
    return float(subprocess.check_output([str(binary), str(threads)], text=True).split()[-1])


def fmas(op: str, T: int, n: int, H: int) -> int:
    """fp32 multiply-adds of mhc_sp's op: the projection (rows x n*H per token) and the sum of
    squares, the collapse (n*H), and for post_pre the post ((n + 1) * n * H)."""
    rows = n if op == "head" else n * (n + 2)
    pre = T * (rows + 2) * n * H
    return pre + (T * (n + 1) * n * H if op == "post_pre" else 0)


def post_bytes(T: int, n: int, H: int) -> int:
    """Bytes mhc_post must read and write: x, residual and residual_out (bf16), post and comb."""
    return 2 * (T * H + 2 * T * n * H) + 4 * (T * n + T * n * n)


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
                *(i[k] for k in ("x", "residual", "post", "comb", "fn", "scale", "base")),
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


def cpu_model() -> str:
    """lscpu's model name."""
    for line in subprocess.check_output(["lscpu"], text=True).splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    peer = ap.add_mutually_exclusive_group(required=True)
    peer.add_argument("--peer-lib", help="the peer's shared library (sgl_peer ops), already built")
    peer.add_argument("--peer-src", help="the peer's sources (mhc.cpp, register.cpp): build them")
    ap.add_argument("--peer-isa", choices=sorted(PEER_FLAGS), default="avx2")
    ap.add_argument("--build-dir", help="where --peer-src and the FMA loop are built")
    ap.add_argument("--roofline", action="store_true", help="FMA peak and %%copy per row")
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

    build_dir = Path(args.build_dir or tempfile.mkdtemp(prefix="cpu_vs_peer_"))
    if args.peer_src:
        lib = build_peer(Path(args.peer_src), args.peer_isa, build_dir / f"peer_{args.peer_isa}")
    else:
        lib = Path(args.peer_lib)
    torch.ops.load_library(str(lib))
    peer = torch.ops.sgl_peer
    torch.set_num_threads(args.threads)
    kernels = mhc_sp.build_info()["cpu_kernels"]
    peak = {}
    if args.roofline:
        # Only the instruction sets this CPU runs (the AVX-512 loop dies of SIGILL elsewhere).
        has = (
            ("avx2", "avx512") if "AVX512" in torch.backends.cpu.get_cpu_capability() else ("avx2",)
        )
        peak = {isa: fma_peak(isa, args.threads, build_dir) for isa in has}
        print(
            f"fp32 FMA peak, {args.threads} threads: "
            + ", ".join(f"{k} {v / 1e9:.1f} G/s" for k, v in peak.items()),
            flush=True,
        )
    # The emulated tables (testing builds) run AVX2 instructions.
    roof_isa = "avx512" if "AVX512" in kernels and "EMULATED" not in kernels else "avx2"
    cpu = torch.device("cpu")
    names = args.ops.split(",")
    rows = []
    for T, H in (map(int, s.split("x")) for s in args.shapes.split(",")):
        i = random_inputs(T, CFG.hc_mult, H, seed=T + H)
        pairs = calls(i, peer, CFG.hc_mult)
        for op in names:
            ours, theirs = pairs[op]
            diff = check_same_math(op, ours(), theirs())
            timed = {"mhc_sp": ours, "peer": theirs}
            if args.roofline and op == "post":
                timed["copy"] = copy_call(post_bytes(T, CFG.hc_mult, H), cpu)
            ratios, ratios_p10, ours_us, peer_us, copy_us = [], [], [], [], []
            for _ in range(args.trials):
                t = time_calls(timed, cpu, warmup=3, repeats=args.repeats)
                ours_us.append(t["mhc_sp"].median * 1e6)
                peer_us.append(t["peer"].median * 1e6)
                ratios.append(t["peer"].median / t["mhc_sp"].median)
                ratios_p10.append(t["peer"].p10 / t["mhc_sp"].p10)
                if "copy" in t:
                    copy_us.append(t["copy"].median * 1e6)
            row = dict(
                op=op,
                tokens=T,
                hidden=H,
                mhc_sp_us=statistics.median(ours_us),
                peer_us=statistics.median(peer_us),
                ratio=statistics.median(ratios),
                ratio_min=min(ratios),
                ratio_max=max(ratios),
                # Of the fastest tenth of the calls: less moved by a busy neighbour than the median.
                ratio_p10=statistics.median(ratios_p10),
                max_abs_diff=diff,
            )
            roof = ""
            if args.roofline and op == "post":
                row["copy_us"] = statistics.median(copy_us)
                row["pct_copy"] = 100 * row["copy_us"] / row["mhc_sp_us"]
                roof = f"  {row['pct_copy']:.0f}% of copy"
            elif args.roofline:
                row["gfma_per_s"] = fmas(op, T, CFG.hc_mult, H) / row["mhc_sp_us"] / 1e3
                row["pct_fma_peak"] = 100 * row["gfma_per_s"] * 1e9 / peak[roof_isa]
                roof = f"  {row['gfma_per_s']:.1f} GFMA/s, {row['pct_fma_peak']:.0f}% of peak"
            rows.append(row)
            print(
                f"{op:9s} T={T:4d} H={H:5d}  mhc_sp {row['mhc_sp_us']:9.1f} us  "
                f"peer {row['peer_us']:9.1f} us  peer/mhc_sp {row['ratio']:.2f}x "
                f"[{row['ratio_min']:.2f}, {row['ratio_max']:.2f}]{roof}",
                flush=True,
            )
    if args.json:
        given = list(argv if argv is not None else sys.argv[1:])
        hidden = {args.peer_lib: "PEER_LIB", args.peer_src: "PEER_SRC", args.build_dir: "BUILD_DIR"}
        forced = os.environ.get("MHC_SP_CPU_KERNELS")
        command = " ".join(
            ([f"MHC_SP_CPU_KERNELS={forced}"] if forced else [])
            + ["python", "bench/cpu_vs_peer.py"]
            + [hidden.get(a, a) for a in given]
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
                cpu_model=cpu_model(),
                peer_isa=args.peer_isa if args.peer_src else "prebuilt",
                peer_flags=PEER_FLAGS[args.peer_isa] if args.peer_src else None,
                fma_peak_per_s=peak or None,
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
