# SPDX-License-Identifier: Apache-2.0
"""What an nsys session would record, checked without nsys: real work runs in subprocesses under
the recording NVTX tool (tools/nvtx_record, attached through NVTX_INJECTION64_PATH as nsys attaches
itself), and the recorded ranges are checked: one ``mhc_sp::<op>`` range per op call and none for
ops run by ops; each fused op's phase children present, nested and in the documented order; every
push popped, on error paths too (a bad argument, a peer that never comes); the Python phases
around the ops as documented; the names the same as in the docs. Also the torch.profiler trace of
``mhc-sp-bench layer --profile torch`` (the fused ops' phases on CPU) and the summary of
``--profile nvtx-record``."""

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import mhc_sp  # noqa: F401  (registers torch.ops.mhc_sp)
from mhc_sp import profiling
from mhc_sp.profiling import FUSED_PHASES, MODEL_PHASE_OPS, NvtxRanges
from tests.cli.nvtx_workload import PEER_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TRANSPORTS = {"shm": "shm", "gloo": "composed"}  # transport -> FUSED_PHASES path


def recorder_or_skip() -> Path:
    try:
        return profiling.nvtx_recorder_library()
    except ValueError as e:
        pytest.skip(f"no recording NVTX tool in this build: {e}")


class Tree:
    """One process's ranges as a tree (children in the order they were pushed)."""

    def __init__(self, recorded: NvtxRanges):
        self.recorded = recorded
        self.ranges = recorded.ranges
        self.children = {i: [] for i in range(len(self.ranges))}
        for i, r in enumerate(self.ranges):
            if r.parent is not None:
                self.children[r.parent].append(i)
        self.cases = {
            r.name.removeprefix("mhc_sp/case "): i
            for i, r in enumerate(self.ranges)
            if r.name.startswith("mhc_sp/case ")
        }

    def names(self, indices) -> list[str]:
        return [self.ranges[i].name for i in indices]

    def below(self, i: int):
        for child in self.children[i]:
            yield child
            yield from self.below(child)

    def ancestors(self, i: int):
        while self.ranges[i].parent is not None:
            i = self.ranges[i].parent
            yield i

    def has(self, name: str) -> bool:
        return any(r.name == name for r in self.ranges)


def registered_ops() -> set[str]:
    return {
        name.removeprefix("mhc_sp::")
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("mhc_sp::")
    }


def is_op_range(name: str) -> bool:
    return name.startswith("mhc_sp::") and "/" not in name


@dataclass
class Workload:
    """tests/cli/nvtx_workload.py, recorded: one Tree per process, the nvtx-record summary and the
    torch.profiler trace of the CLI runs."""

    trees: list[Tree]
    summary: dict
    trace_events: list[dict]

    def processes(self, with_range: str) -> list[Tree]:
        return [t for t in self.trees if t.has(with_range)]


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Workload:
    recorder_or_skip()
    folder = tmp_path_factory.mktemp("nvtx_workload")
    # Only where to write: the workload's first command (mhc-sp-bench --profile nvtx-record)
    # attaches the recording tool to its process and, through the environment, to the ranks.
    env = dict(os.environ, **{profiling.NVTX_RECORD_VAR: str(folder / "nvtx.%p.jsonl")})
    env.pop(profiling.NVTX_INJECTION_VAR, None)
    run = subprocess.run(
        [sys.executable, str(HERE / "nvtx_workload.py"), str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    files = sorted(folder.glob("nvtx.*.jsonl"))
    trees = [Tree(profiling.nvtx_ranges(profiling.read_nvtx_events(f))) for f in files]
    # This process, the layer benchmark's two ranks, the workload world's two ranks.
    assert len(trees) == 5, [f.name for f in files]
    trace = json.loads((folder / "layer_trace.json").read_text())["traceEvents"]
    return Workload(trees, json.loads((folder / "summary.json").read_text()), trace)


def the_case(w: Workload, case: str) -> list[tuple[Tree, int]]:
    found = [(t, t.cases[case]) for t in w.trees if case in t.cases]
    assert found, f"no process recorded case {case!r}"
    return found


# ---- sound recordings --------------------------------------------------------------------------


@pytest.mark.distributed
def test_every_push_is_popped_on_every_path(workload):
    for tree in workload.trees:
        assert tree.recorded.unclosed == [], tree.recorded.unclosed[:5]
        assert tree.recorded.unmatched_pops == [], tree.recorded.unmatched_pops[:5]
        assert {r.domain for r in tree.ranges} == {"mhc_sp"}
    # The error paths ran, and closed what they opened.
    for case in ("bad mhc_post_pre", "shm bad fused_layer", "gloo bad fused_layer"):
        for tree, i in the_case(workload, case):
            [op] = tree.children[i]
            assert tree.ranges[op].name == f"mhc_sp::{case.split()[-1]}"
            assert tree.children[op] == [], "the checks fail before any phase"
    [(tree, i)] = the_case(workload, "shm timeout fused_layer")
    [op] = tree.children[i]
    assert tree.ranges[op].name == "mhc_sp::fused_layer"
    # It gave up waiting for its peer in the exchange, which is closed too.
    [exchange] = tree.children[op]
    assert tree.ranges[exchange].name == "mhc_sp::fused_layer/exchange"
    assert tree.ranges[exchange].seconds >= 0.9 * PEER_TIMEOUT_S


# ---- op ranges ---------------------------------------------------------------------------------


@pytest.mark.distributed
def test_every_op_call_opens_one_range_and_ops_run_by_ops_none(workload):
    registered = registered_ops()
    for name in ("mhc_pre", "mhc_post", "mhc_post_pre", "mhc_pre_broadcast", "hc_head"):
        [(tree, i)] = the_case(workload, f"math {name}")
        assert tree.names(tree.children[i]) == [f"mhc_sp::{name}"]
        assert tree.children[tree.children[i][0]] == [], f"{name} opened ranges inside"
    for op in ("shard_tokens", "all_gather", "reduce_scatter", "all_reduce"):
        for transport in TRANSPORTS:
            for tree, i in the_case(workload, f"{transport} {op}"):
                assert tree.names(tree.children[i]) == [f"mhc_sp::{op}"]
                assert tree.children[tree.children[i][0]] == []
    ops_seen = set()
    for tree in workload.trees:
        for i, r in enumerate(tree.ranges):
            if not is_op_range(r.name):
                continue
            op = r.name.removeprefix("mhc_sp::")
            ops_seen.add(op)
            assert op in registered, f"{r.name} is no registered op"
            # An op's range holds its own phases only: the ops it runs open none.
            inner = tree.names(tree.below(i))
            assert all(n.startswith(f"{r.name}/") for n in inner), (r.name, inner)
    assert ops_seen >= {"fused_entry", "fused_layer", "fused_head", "mhc_pre", "all_gather"}


@pytest.mark.distributed
def test_fused_phases_nest_in_the_documented_order(workload):
    for transport, path in TRANSPORTS.items():
        for op, phases in FUSED_PHASES.items():
            for how in ("sharded", "replicated"):
                expected = [p for p in phases[path] if how == "sharded" or p != "gather"]
                cases = the_case(workload, f"{transport} {op} {how}")
                assert len(cases) == 2, "one per rank"
                for tree, i in cases:
                    [top] = tree.children[i]
                    assert tree.ranges[top].name == f"mhc_sp::{op}"
                    kids = tree.children[top]
                    got = [n.removeprefix(f"mhc_sp::{op}/") for n in tree.names(kids)]
                    assert got == expected, (transport, op, how, got)
                    outer = tree.ranges[top]
                    last_end = outer.start_ns
                    for k in kids:
                        r = tree.ranges[k]
                        assert last_end <= r.start_ns <= r.end_ns <= outer.end_ns, r
                        assert r.depth == outer.depth + 1 and r.tid == outer.tid
                        last_end = r.end_ns


# ---- Python phases -----------------------------------------------------------------------------


@pytest.mark.distributed
def test_model_phases_nest_around_the_ops_as_documented(workload):
    phases_seen, ops_in = set(), {}
    for tree, case in the_case(workload, "model"):
        for i in tree.below(case):
            name = tree.ranges[i].name
            if name.startswith("mhc_sp/"):
                phases_seen.add(name.removeprefix("mhc_sp/"))
            if not is_op_range(name):
                continue
            enclosing = [
                tree.ranges[a].name.removeprefix("mhc_sp/")
                for a in tree.ancestors(i)
                if tree.ranges[a].name.startswith("mhc_sp/")
            ]
            phase = enclosing[0]
            op = name.removeprefix("mhc_sp::")
            assert phase in MODEL_PHASE_OPS, f"{op} runs in {phase!r}, outside the model phases"
            assert op in MODEL_PHASE_OPS[phase], f"{op} runs in phase {phase!r}"
            ops_in.setdefault(phase, set()).add(op)
    assert {"embed", "boundary", "attention", "moe", "lm_head", "mtp"} <= phases_seen
    assert {"fused_entry", "fused_layer", "fused_head"} <= ops_in["boundary"]
    assert {"mhc_pre", "shard_tokens", "fused_head", "all_gather"} <= ops_in["boundary"]


# ---- names: one table, the docs and the sources agree ------------------------------------------


def phase_table() -> str:
    """The docs' table of the fused ops' phase ranges, as rendered from FUSED_PHASES."""
    lines = [
        "| op range | shm (one pass) | composed (gloo, NCCL, symm fallback) |",
        "|---|---|---|",
    ]
    for op, paths in FUSED_PHASES.items():
        cells = [" → ".join(f"`/{p}`" for p in paths[k]) for k in ("shm", "composed")]
        lines.append(f"| `mhc_sp::{op}` | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def model_phase_table() -> str:
    lines = ["| Python phase | mhc_sp ops run directly inside it |", "|---|---|"]
    for name, ops in MODEL_PHASE_OPS.items():
        lines.append(f"| `mhc_sp/{name}` | {', '.join(f'`{o}`' for o in ops) or '(none)'} |")
    return "\n".join(lines)


def test_docs_show_the_tables_and_name_no_other_phase():
    doc = (ROOT / "docs" / "profiling-nvtx.md").read_text()
    assert phase_table() in doc, "docs/profiling-nvtx.md: the phase table differs from FUSED_PHASES"
    assert model_phase_table() in doc, "docs/profiling-nvtx.md: the model phase table differs"
    known = {
        f"mhc_sp::{op}/{p}" for op, paths in FUSED_PHASES.items() for v in paths.values() for p in v
    }
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        named = set(re.findall(r"mhc_sp::(?:fused_\w+)/\w+", text))
        assert named <= known, f"{path.name} names phases no op opens: {sorted(named - known)}"
        # The short spellings too: `fused_layer/exchange`, and a bare phase `/post_pre`.
        short = {f"mhc_sp::{s}" for s in re.findall(r"`(fused_\w+/\w+)`", text)}
        assert short <= known, f"{path.name} names phases no op opens: {sorted(short - known)}"
        bare = set(re.findall(r"`/(\w+)`", text))
        phases = {name.rsplit("/", 1)[1] for name in known}
        assert bare <= phases, f"{path.name} names phases no op opens: {sorted(bare - phases)}"


def test_sources_open_the_documented_ranges_only():
    registered = registered_ops()
    known = {f"{op}/{p}" for op, paths in FUSED_PHASES.items() for v in paths.values() for p in v}
    sources = [*ROOT.glob("csrc/**/*.cpp"), *ROOT.glob("csrc/**/*.cu")]
    phases = {
        m for f in sources for m in re.findall(r'MHC_SP_NVTX_PHASE\("([^"]+)"\)', f.read_text())
    }
    ranges = {
        m for f in sources for m in re.findall(r'MHC_SP_NVTX_RANGE\("([^"]+)"\)', f.read_text())
    }
    assert phases == known, (sorted(phases - known), sorted(known - phases))
    assert ranges == registered, (sorted(ranges - registered), sorted(registered - ranges))


# ---- the CLI: torch.profiler on CPU and nvtx-record --------------------------------------------


@pytest.mark.distributed
def test_layer_torch_profile_shows_the_fused_phases(workload):
    events = [e for e in workload.trace_events if e.get("ph") == "X"]
    ops = [e for e in events if e["name"] == "mhc_sp::fused_layer"]
    assert ops, "the op shows in the trace"

    def inside(e, o):
        return (
            o["tid"] == e["tid"] and o["ts"] <= e["ts"] <= e["ts"] + e["dur"] <= o["ts"] + o["dur"]
        )

    for phase in FUSED_PHASES["fused_layer"]["shm"]:
        name = f"mhc_sp::fused_layer/{phase}"
        found = [e for e in events if e["name"] == name]
        assert found, f"{name} is not in the torch.profiler trace"
        assert all(any(inside(e, o) for o in ops) for e in found), f"{name} outside its op"
    # The same run under the recording tool: every op inside the benchmark's phase, on both ranks.
    ranks = workload.processes("mhc_sp/layer T=8")
    assert len(ranks) == 2, "each rank runs the benchmark phase"
    for tree in ranks:
        for i, r in enumerate(tree.ranges):
            if is_op_range(r.name):
                outer = tree.names(tree.ancestors(i))
                assert "mhc_sp/layer T=8" in outer, f"{r.name} outside the benchmark phase"


@pytest.mark.distributed
def test_nvtx_record_summary_from_the_cli(workload):
    doc = workload.summary
    assert doc["kind"] == "nvtx-record"
    assert doc["unclosed_ranges"] == 0 and doc["unmatched_pops"] == 0
    rows = {r["range"]: r for r in doc["ranges"]}
    region = rows["mhc_sp/profile"]
    assert region["count"] == 1
    [parent] = workload.processes("mhc_sp/profile")
    [profile] = [i for i, r in enumerate(parent.ranges) if r.name == "mhc_sp/profile"]
    in_profile = [parent.ranges[i] for i in parent.below(profile)]
    for op in ("mhc_post_pre", "hc_head"):
        row = rows[f"mhc_sp::{op}"]
        # As many as the recording holds inside the region (this process's ranges).
        calls = sum(r.name == f"mhc_sp::{op}" for r in in_profile)
        assert row["domain"] == "mhc_sp" and row["count"] == calls >= 3
        assert row["mean_us"] * row["count"] == pytest.approx(row["total_us"], abs=1e-3 * calls)
        assert 0 < row["min_us"] <= row["mean_us"] <= row["max_us"]
        assert row["total_us"] < region["total_us"]
        phase = [r for name, r in rows.items() if name.startswith(f"mhc_sp/{op} T=4")]
        assert len(phase) == 1 and phase[0]["count"] == 1, "the benchmark's phase of the op"
    totals = [r["total_us"] for r in doc["ranges"]]
    assert totals == sorted(totals, reverse=True)


def test_nvtx_record_needs_the_tool_attached(tmp_path):
    if os.environ.get(profiling.NVTX_INJECTION_VAR):
        pytest.skip("this process runs under an NVTX tool")
    recorder_or_skip()
    with pytest.raises(ValueError, match=r"^profile: nvtx-record: the recording NVTX tool is not"):
        with profiling.profiled("nvtx-record", str(tmp_path / "s.json")):
            pass
    assert not (tmp_path / "s.json").exists()
    with pytest.raises(ValueError, match=r"^profile: expected one of nsys, torch, nvtx-record"):
        with profiling.profiled("perf"):
            pass


def test_pairing_finds_unclosed_ranges_and_stray_pops():
    """What the checks above rely on: pops pair per thread and domain, nesting gives parents, and
    a push never popped or a pop without a push is reported, not dropped."""

    def ev(kind, tid, ns, domain="mhc_sp", message=None):
        return {"kind": kind, "tid": tid, "ns": ns, "domain": domain, "message": message}

    events = [
        ev("push", 1, 0, message="mhc_sp/outer"),
        ev("push", 2, 1, message="mhc_sp::all_reduce"),  # another thread
        ev("push", 1, 2, message="mhc_sp::fused_layer"),
        ev("push", 1, 3, domain="", message="torch"),  # another domain
        ev("pop", 1, 4),
        ev("pop", 1, 5, domain=""),
        ev("pop", 1, 6),
        ev("pop", 1, 7),  # a stray pop
    ]
    got = profiling.nvtx_ranges(events)
    assert [(r.name, r.depth, r.parent) for r in got.ranges] == [
        ("mhc_sp/outer", 0, None),
        ("mhc_sp::fused_layer", 1, 0),
        ("torch", 0, None),
    ]
    assert [e["message"] for e in got.unclosed] == ["mhc_sp::all_reduce"]
    assert [e["ns"] for e in got.unmatched_pops] == [7]
    summary = profiling.summarize_ranges(got)
    assert (summary["unclosed_ranges"], summary["unmatched_pops"]) == (1, 1)
    assert {r["range"]: r["total_us"] for r in summary["ranges"]} == {
        "mhc_sp/outer": 0.006,
        "mhc_sp::fused_layer": 0.002,
        "torch": 0.002,
    }
