# SPDX-License-Identifier: Apache-2.0
"""Mutation testing of the device code on the emulated device.

Plants one bug at a time in the CUDA device sources (each a kind that broke fused collectives in
the field: barriers, memory orders and scopes, run-ahead indices, PDL, MMA operands, sums, rows),
compiles only the emulated device's translation units that the bug's tests run, links a scratch
copy of the emulated module, and runs the tests that should kill it:

* judge "emulated": `pytest -m emulated` on the normal build (killed = a test fails);
* judge "tsan": the same tests on the ThreadSanitizer build of scripts/sanitize.sh (killed = a test
  fails or ThreadSanitizer reports), for memory-order bugs that a correct schedule cannot show.

The source tree and the build folders are never written: each bug is planted in a scratch copy of
csrc/, compiled from there, and the objects and the module go to the scratch folder too. One table
comes out:

    .venv/bin/python scripts/mutants.py                 # every mutant -> bench/results/mutants.json
    .venv/bin/python scripts/mutants.py --list          # the table of mutants, nothing run
    .venv/bin/python scripts/mutants.py --only NAME...  # some of them

Needs the normal build (scripts/bootstrap.sh) and, for the tsan mutants, the ThreadSanitizer build
(MHC_SP_SANITIZE=thread bash scripts/sanitize.sh; the tsan mutants are skipped without it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMULATED = "tests/emulated"
OPS = f"{EMULATED}/test_emulated_ops.py"
SYMM = f"{EMULATED}/test_emulated_symm.py"
AHEAD = f"{EMULATED}/test_emulated_run_ahead.py"
HARNESS = f"{EMULATED}/test_emulated_symm_sim.py"
SANITIZED_SITE = ROOT / "build/sanitize-thread/site"


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    kind: str
    path: str  # file under csrc/
    old: str  # exact text, found exactly once
    new: str
    units: tuple[str, ...]  # emulated translation units (csrc/emulation/sources/<unit>.cpp)
    tests: tuple[str, ...]  # pytest arguments (always with -m emulated)
    judge: str = "emulated"  # or "tsan"


SYMM_HC4 = ("fused_layer_hc3_4",)
COLLECTIVES = ("symm_collective_launch",)
PRE_UNITS = ("mhc_pre",)

MUTANTS = [
    # ---- barriers: what only a block whose warps run apart shows -------------------------------
    Mutant(
        "chunk barrier dropped",
        "barrier dropped",
        "cuda/device/pre.cuh",
        "    __syncthreads();  // previous chunk's MMAs are done reading Xs\n",
        "",
        PRE_UNITS,
        (OPS, "-k", "matches_reference and mhc_pre"),
    ),
    Mutant(
        "finish barrier dropped",
        "barrier dropped",
        "cuda/device/pre.cuh",
        "    mix_s[e] = sum[0];\n  }\n  __syncthreads();\n",
        "    mix_s[e] = sum[0];\n  }\n",
        PRE_UNITS,
        (OPS, "-k", "matches_reference and mhc_pre"),
    ),
    Mutant(
        "block_sum barrier narrowed to a warp",
        "barrier narrowed",
        "cuda/device/common.cuh",
        "  if (lane == 0) scratch[warp] = v;\n  __syncthreads();",
        "  if (lane == 0) scratch[warp] = v;\n  __syncwarp(0xffffffffu);",
        PRE_UNITS,
        (OPS, "-k", "matches_reference and mhc_pre"),
    ),
    Mutant(
        "post coefficients barrier dropped",
        "barrier dropped",
        "cuda/device/post.cuh",
        "    __syncthreads();  // the previous item's readers are done with coef\n",
        "",
        ("mhc_kernels",),
        (OPS, "-k", "matches_reference and mhc_post and not pre"),
    ),
    Mutant(
        "barrier before the release dropped",
        "barrier dropped",
        "transport/symm/device/sync.cuh",
        "  __syncthreads();  // the block's stores precede the releases below\n",
        "",
        COLLECTIVES,
        (SYMM, "-k", "collectives"),
    ),
    Mutant(
        "split-K barrier before the arrival dropped",
        "barrier dropped",
        "cuda/device/pre.cuh",
        "  __threadfence();\n  __syncthreads();\n  if (threadIdx.x == 0) {\n    const int done",
        "  __threadfence();\n  if (threadIdx.x == 0) {\n    const int done",
        SYMM_HC4,
        (SYMM, "-k", "in_a_row and 2"),
        "tsan",  # another warp's partials written after the arrival: a race, not a schedule
    ),
    # ---- ranks a call ahead: indices, epochs, re-arming, cleaning -----------------------------
    Mutant(
        "Lamport mailbox index frozen",
        "mailbox index frozen",
        "transport/symm/device/layer_kernels.cuh",
        "  const int64_t mailbox = symm::mailbox_index(call);\n  const LamportTag tag =\n"
        "      symm::lamport_tag(boundary::Op::kFusedLayer",
        "  const int64_t mailbox = 0;\n  const LamportTag tag =\n"
        "      symm::lamport_tag(boundary::Op::kFusedLayer",
        SYMM_HC4,
        (AHEAD, "-k", "lamport_mailbox_is_reused"),
    ),
    Mutant(
        "exchange half frozen",
        "half index frozen",
        "transport/symm/device/sync.cuh",
        "  return buffer + symm::half_offset(s.L, symm::half_index(call));",
        "  return buffer + symm::half_offset(s.L, 0);",
        SYMM_HC4 + COLLECTIVES,
        (AHEAD, "-k", "one_barrier"),
    ),
    Mutant(
        "barrier epoch not advanced",
        "epoch index frozen",
        "transport/symm/device/sync.cuh",
        "  if (threadIdx.x == 0) s.state->epochs[block] = epoch;",
        "  if (threadIdx.x == 0) s.state->epochs[block] = epoch - 1;",
        SYMM_HC4 + COLLECTIVES,
        (AHEAD, "-k", "alternate_halves"),
    ),
    Mutant(
        "the next mailbox's tags re-armed",
        "clean of the wrong stage",
        "transport/symm/device/layer_kernels.cuh",
        "           [&] { rearm_lamport_tags(s, mailbox); });\n}\n\n// ---- the sharded",
        "           [&] { rearm_lamport_tags(s, (mailbox + 1) % symm::kMailboxes); });\n}\n\n"
        "// ---- the sharded",
        SYMM_HC4,
        (AHEAD, "-k", "lamport_mailbox_is_reused"),
    ),
    Mutant(
        "consumed Lamport vector not re-armed",
        "re-arm missing",
        "transport/symm/device/lamport.cuh",
        "      m.add_to(acc);\n      Mail<V>::armed().store(at);\n",
        "      m.add_to(acc);\n",
        SYMM_HC4,
        (AHEAD, "-k", "lamport_mailbox_is_reused"),
    ),
    Mutant(
        "-0 sent into the mailbox",
        "-0 sent",
        "transport/symm/device/lamport.cuh",
        "Mail<V>::of(Pack<V>::load(src + e)).sendable().store(dst + e * 2);",
        "Mail<V>::of(Pack<V>::load(src + e)).store(dst + e * 2);",
        SYMM_HC4,
        (AHEAD, "-k", "lamport_mailbox_is_reused"),
    ),
    Mutant(
        "call-end arrival counter not cleared",
        "split-K flag not cleared",
        "transport/symm/device/sync.cuh",
        "      last();\n      atomicExch(done, 0u);  // atomic: the other blocks' increments are"
        " ordered only through it\n",
        "      last();\n",
        SYMM_HC4,
        (SYMM, "-k", "in_a_row and 2 or counter_once"),
    ),
    Mutant(
        "fused tile counter not cleared",
        "split-K flag not cleared",
        "cuda/device/pre.cuh",
        "  if (threadIdx.x == 0) atomicExch(a.counters + tile, 0);",
        "",
        SYMM_HC4,
        (SYMM, "-k", "in_a_row and 2 or counter_once"),
    ),
    # ---- programmatic dependent launch --------------------------------------------------------
    Mutant(
        "PDL wait moved after the finish",
        "PDL wait moved",
        "transport/symm/fused_layer.cuh",
        "  wait_for_prerequisite_grid();  // kernel A's partial sums, residual_out and epochs "
        "are complete\n  sharded_layer_finish<N, V>(P);",
        "  sharded_layer_finish<N, V>(P);\n  wait_for_prerequisite_grid();",
        SYMM_HC4,
        (AHEAD, "-k", "starts_beside"),
    ),
    # ---- the PTX text: operands, orders, scopes -----------------------------------------------
    Mutant(
        "MMA A operands swapped",
        "MMA operand order",
        "cuda/device/common.cuh",
        "{%4, %5, %6, %7}",
        "{%4, %6, %5, %7}",
        PRE_UNITS,
        (OPS, "-k", "matches_reference and mhc_pre"),
    ),
    Mutant(
        "MMA B fragment halves swapped",
        "MMA fragment order",
        "cuda/device/pre.cuh",
        "        split_bf16x3(f0, f1, b0[0], b0[1], b0[2]);",
        "        split_bf16x3(f1, f0, b0[0], b0[1], b0[2]);",
        PRE_UNITS,
        (OPS, "-k", "matches_reference and mhc_pre"),
    ),
    Mutant(
        "release store scope narrowed to .gpu",
        "scope narrowed",
        "transport/symm/device/ptx.cuh",
        "st.release.sys.global.u64",
        "st.release.gpu.global.u64",
        COLLECTIVES,
        (SYMM, "-k", "collectives and 2"),
    ),
    Mutant(
        "Lamport push scope narrowed to .gpu",
        "scope narrowed",
        "transport/symm/device/ptx.cuh",
        "st.relaxed.sys.global.v4.b32",
        "st.relaxed.gpu.global.v4.b32",
        COLLECTIVES,
        (SYMM, "-k", "collectives and 2"),
    ),
    Mutant(
        "broken-word poll scope narrowed to .cta",
        "scope narrowed",
        "transport/symm/device/ptx.cuh",
        "ld.relaxed.sys.global.u32",
        "ld.relaxed.cta.global.u32",
        COLLECTIVES,
        (SYMM, "-k", "collectives and 2"),
    ),
    Mutant(
        "Lamport poll through a weak load",
        "weak poll",
        "transport/symm/device/ptx.cuh",
        "ld.relaxed.sys.global.v4.b32",
        "ld.global.v4.b32",
        SYMM_HC4,
        (AHEAD, "-k", "lamport_mailbox_is_reused"),
    ),
    Mutant(
        "barrier release made relaxed",
        "release made relaxed",
        "transport/symm/device/ptx.cuh",
        "st.release.sys.global.u64",
        "st.relaxed.sys.global.u64",
        COLLECTIVES,
        (SYMM, "-k", "collectives and 2"),
        "tsan",
    ),
    Mutant(
        "barrier acquire made relaxed",
        "acquire made relaxed",
        "transport/symm/device/ptx.cuh",
        "ld.acquire.sys.global.u64",
        "ld.relaxed.sys.global.u64",
        COLLECTIVES,
        (SYMM, "-k", "collectives and 2"),
        "tsan",
    ),
    Mutant(
        "fence before the split-K arrival dropped",
        "fence dropped",
        "cuda/device/pre.cuh",
        "  __threadfence();\n  __syncthreads();\n  if (threadIdx.x == 0) {\n    const int done",
        "  __syncthreads();\n  if (threadIdx.x == 0) {\n    const int done",
        # The plain op's fused decode: in the symm kernels a cross-rank barrier already orders the
        # partials before the last block reads them.
        PRE_UNITS,
        (OPS, "-k", "matches_reference and mhc_pre and split"),
        "tsan",
    ),
    Mutant(
        "fence after the split-K arrival dropped",
        "fence dropped",
        "cuda/device/pre.cuh",
        "    __threadfence();  // orders this block's later reads of the other blocks' partials\n",
        "",
        SYMM_HC4,
        (SYMM, "-k", "in_a_row and 2"),
        "tsan",
    ),
    # ---- sums, rows and tiles -----------------------------------------------------------------
    Mutant(
        "tree adds a difference",
        "tree operator",
        "cuda/device/leaf_tree.h",
        "for (int w = 0; w < W; ++w) carry[w] = n[w * stride] + carry[w];",
        "for (int w = 0; w < W; ++w) carry[w] = n[w * stride] - carry[w];",
        PRE_UNITS,
        (OPS, "-k", "mhc_pre"),
    ),
    Mutant(
        "landed rows summed in reverse rank order",
        "rank order of the sum",
        "transport/symm/device/exchange.cuh",
        "      for (int p = 0; p < E->s.world; ++p) {\n        float f[V];",
        "      for (int p = E->s.world - 1; p >= 0; --p) {\n        float f[V];",
        SYMM_HC4,
        (SYMM, "-k", "rank_order"),
    ),
    Mutant(
        "last shard row not sent",
        "off-by-one rows",
        "transport/symm/device/exchange.cuh",
        "const int64_t end = min(r1, E.rows - q * shard);",
        "const int64_t end = min(r1, E.rows - q * shard - 1);",
        SYMM_HC4,
        (SYMM, "-k", "sharded_rows_equal"),
    ),
    Mutant(
        "last partial token group not finished",
        "off-by-one tiles",
        "cuda/device/pre.cuh",
        "  const int64_t groups = (a.T + kFinishTokens - 1) / kFinishTokens;",
        "  const int64_t groups = a.T / kFinishTokens;",
        PRE_UNITS,
        (OPS, "-k", "matches_reference and mhc_pre"),
    ),
    Mutant(
        "padding rows finished",
        "padding rows finished",
        "transport/symm/device/layer_kernels.cuh",
        "max(int64_t(0), min(t1, E.valid) - t0);",
        "max(int64_t(0), t1 - t0);",
        SYMM_HC4,
        (SYMM, "-k", "in_a_row and 2"),
    ),
    # ---- the GPU harness's multi-rank wrappers (testing/symm_sim.cu) ---------------------------
    Mutant(
        "harness finish runs rank 0's call for every rank",
        "rank index frozen",
        "testing/symm_sim.cu",
        "if (!absent(P)) cuda::sharded_layer_finish<N, V>(P.r[blockIdx.y]);",
        "if (!absent(P)) cuda::sharded_layer_finish<N, V>(P.r[0]);",
        ("symm_sim",),
        (HARNESS, "-k", "fused_layer and 2"),
    ),
    Mutant(
        "harness absent rank arrives",
        "absent rank ignored",
        "testing/symm_sim.cu",
        "  return static_cast<int>(blockIdx.y) == P.absent;",
        "  return false;",
        ("symm_sim",),
        (HARNESS, "-k", "absent"),
    ),
]


def find_build() -> Path:
    """The normal build folder (the one with an _emulated target that was built last)."""
    found = [
        p.parent for p in (ROOT / "build").glob("cmake-*/build.ninja") if "sanitize" not in str(p)
    ]
    found = [p for p in found if list(p.glob("CMakeFiles/_emulated.dir"))]
    if not found:
        sys.exit("mutants: no normal build with the emulated device (run scripts/bootstrap.sh)")
    return max(found, key=lambda p: p.joinpath("build.ninja").stat().st_mtime)


def find_tsan_build() -> Path | None:
    found = list((ROOT / "build").glob("cmake-*-sanitize-thread/build.ninja"))
    if not found or not (SANITIZED_SITE / "mhc_sp").is_dir():
        return None
    return found[0].parent


def ninja_commands(build: Path, target: str) -> list[str]:
    out = subprocess.run(
        ["ninja", "-C", str(build), "-t", "commands", target],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line for line in out.splitlines() if line.strip()]


def command_of(line: str) -> list[str]:
    """The compiler or linker call of a ninja command (CMake wraps links in `: && ... && :`)."""
    (part,) = [p for p in line.split("&&") if " -o " in p]
    return shlex.split(part)


class Build:
    """A build folder's emulated module, relinked in a scratch folder with some objects replaced."""

    def __init__(self, build: Path, site: Path, scratch: Path):
        self.build, self.scratch = build, scratch
        self.link = command_of(ninja_commands(build, "_emulated")[-1])
        out = self.link[self.link.index("-o") + 1]
        self.module = Path(out) if Path(out).is_absolute() else build / out
        # A copy of the package whose emulated module is the scratch one (the rest linked).
        self.site = scratch / "site"
        package = self.site / "mhc_sp"
        shutil.copytree(
            site / "mhc_sp",
            package,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__", "_emulated*"),
        )
        self.target = package / self.module.name

    def object_of(self, unit: str) -> str:
        name = f"csrc/emulation/sources/{unit}.cpp.o"
        hits = [a for a in self.link if a.endswith(name)]
        if len(hits) != 1:
            raise SystemExit(f"mutants: no object {name} in the link of {self.build}")
        return hits[0]

    def compile(self, unit: str, sources: Path) -> tuple[str, str]:
        """Compiles `unit` as the build does, from the copy of csrc/ at `sources`."""
        obj = self.object_of(unit)
        command = ninja_commands(self.build, obj)[-1]
        mine = str(self.scratch / (unit + ".o"))
        csrc = str(ROOT / "csrc")
        # The object goes to the scratch folder; no dependency file (-MD -MF path -MT target);
        # every path into csrc/ (sources, include folders) points into the copy.
        cleaned, skip = [], False
        for a in (x.replace(csrc, str(sources)) for x in command_of(command)):
            if skip:
                skip = False
                continue
            if a in ("-MF", "-MT", "-MQ"):
                skip = True
                continue
            if a in ("-MD", "-MMD"):
                continue
            cleaned.append(mine if cleaned and cleaned[-1] == "-o" else a)
        subprocess.run(cleaned, cwd=self.build, check=True, capture_output=True, text=True)
        return obj, mine

    def relink(self, replaced: dict[str, str]) -> None:
        # The mutated objects first: the device functions are inline (`__forceinline__` is
        # `inline` for the host compiler), so other objects carry copies of the same weak symbols,
        # and the linker keeps the first one it sees.
        out = str(self.scratch / self.module.name)
        at = self.link.index("-o")
        rest = [a for a in self.link[at + 2 :] if a not in replaced]
        args = [*self.link[:at], "-o", out, *replaced.values(), *rest]
        subprocess.run(args, cwd=self.build, check=True, capture_output=True, text=True)
        shutil.copy2(out, self.target)


def plant(m: Mutant, sources: Path) -> Path:
    """A copy of csrc/ with the mutant planted (the tree itself is never touched, so a build that
    runs meanwhile compiles the real sources)."""
    shutil.rmtree(sources, ignore_errors=True)
    shutil.copytree(ROOT / "csrc", sources)
    path = sources / m.path
    text = path.read_text()
    count = text.count(m.old)
    if count != 1:
        raise SystemExit(
            f"mutants: {m.name!r}: the text to change occurs {count} times in csrc/{m.path}"
        )
    path.write_text(text.replace(m.old, m.new))
    return sources


def run_tests(m: Mutant, b: Build, logs: Path, timeout: float) -> tuple[str, str]:
    env = dict(os.environ, PYTHONPATH=str(b.site))
    log_dir = logs / m.name.replace(" ", "_")
    log_dir.mkdir(parents=True, exist_ok=True)
    if m.judge == "tsan":
        preload = [
            subprocess.run(
                ["gcc", f"-print-file-name={lib}"], capture_output=True, text=True
            ).stdout.strip()
            for lib in ("libtsan.so", "libstdc++.so")
        ]
        env["LD_PRELOAD"] = " ".join(preload)
        env["TSAN_OPTIONS"] = (
            f"log_path={log_dir}/tsan:ignore_noninstrumented_modules=1:report_signal_unsafe=0"
        )
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "-m",
        "emulated",
        *m.tests,
    ]
    try:
        r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        output, code = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        output, code = (
            (e.stdout or b"").decode(errors="replace")
            if isinstance(e.stdout, bytes)
            else (e.stdout or ""),
            -1,
        )
    (log_dir / "pytest.log").write_text(output)
    reports = [
        line
        for p in log_dir.glob("tsan*")
        for line in p.read_text(errors="replace").splitlines()
        if "WARNING: ThreadSanitizer" in line
    ]
    lines = output.splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    why = [line[1:].strip() for line in lines if line.startswith("E  ")]
    if failed and why:  # the test, and the first line of what it raised or asserted
        failed[0] = f"{failed[0].split(' - ')[0]}: {why[0]}"
    if reports:
        return "killed", reports[0].strip()
    if code == -1:
        return "killed", f"the tests ran past {timeout:.0f} s"
    if code == 5:
        return "error", "no test selected"
    if code != 0:
        return "killed", (failed[0] if failed else lines[-1] if lines else f"exit {code}")[:200]
    return "survived", (lines[-1] if lines else "")[:200]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="mutants whose name contains one")
    parser.add_argument("--judge", choices=["emulated", "tsan"], help="only mutants of this judge")
    parser.add_argument("--out", default="bench/results/mutants.json")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per mutant's tests")
    a = parser.parse_args()
    chosen = [
        m
        for m in MUTANTS
        if (not a.only or any(o in m.name for o in a.only))
        and (a.judge is None or m.judge == a.judge)
    ]
    if a.list:
        for m in chosen:
            print(f"{m.kind:28s} {m.judge:9s} {m.path:42s} {m.name}")
        print(f"{len(chosen)} mutants")
        return 0
    if not chosen:
        print("mutants: no mutant matches", file=sys.stderr)
        return 2
    # A stop (Ctrl-C, a timeout's SIGTERM) still removes the scratch folder.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("mutants: stopped by SIGTERM"))
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="mhc_sp_mutants_") as tmp:
        builds: dict[str, Build | None] = {
            "emulated": Build(find_build(), ROOT / "python", Path(tmp) / "emulated")
        }
        tsan = find_tsan_build()
        builds["tsan"] = Build(tsan, SANITIZED_SITE, Path(tmp) / "tsan") if tsan else None
        rows = []
        for m in chosen:
            t0 = time.time()
            b = builds[m.judge]
            if b is None:
                rows.append(
                    {
                        **row_of(m),
                        "result": "not run",
                        "evidence": "no ThreadSanitizer build (scripts/sanitize.sh)",
                    }
                )
                print(f"{'not run':9s} {m.name}", flush=True)
                continue
            sources = plant(m, Path(tmp) / "csrc")
            try:
                replaced = dict(b.compile(u, sources) for u in m.units)
            except subprocess.CalledProcessError as e:
                rows.append(
                    {
                        **row_of(m),
                        "result": "error",
                        "evidence": "does not compile: " + (e.stderr or "")[-300:],
                    }
                )
                continue
            b.relink(replaced)
            result, evidence = run_tests(m, b, Path(tmp) / "logs", a.timeout)
            rows.append(
                {
                    **row_of(m),
                    "result": result,
                    "evidence": evidence,
                    "seconds": round(time.time() - t0, 1),
                }
            )
            print(f"{result:9s} {time.time() - t0:6.1f} s  {m.name}: {evidence}", flush=True)
    killed = sum(r["result"] == "killed" for r in rows)
    doc = {
        "kind": "mutants",
        "command": "python scripts/mutants.py " + " ".join(sys.argv[1:]),
        "mutants": len(rows),
        "killed": killed,
        "survived": [r["name"] for r in rows if r["result"] == "survived"],
        "not_killed": [r["name"] for r in rows if r["result"] != "killed"],
        "seconds": round(time.time() - started),
        "load_average_at_end": os.getloadavg(),
        "rows": rows,
    }
    out = ROOT / a.out
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"mutants: {killed} of {len(rows)} killed in {doc['seconds']} s -> {a.out}")
    return 0 if killed == len(rows) else 1


def row_of(m: Mutant) -> dict:
    return {
        "name": m.name,
        "kind": m.kind,
        "file": "csrc/" + m.path,
        "judge": m.judge,
        "tests": " ".join(m.tests),
    }


if __name__ == "__main__":
    sys.exit(main())
