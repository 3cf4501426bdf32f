# SPDX-License-Identifier: Apache-2.0
"""The README's and the docs' promises: the README opens with the two commands a new user runs
(CI runs its test command verbatim), gets to a measured result quickly and stays short; every
mhc-sp-bench command in the README, the docs and bench/cpu_bench.sh parses; every recorded
result they show is what `mhc-sp-bench show` prints for the file; the files they name exist; the
tuner's stability table quotes its records, whose answers are today's rule's."""

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from mhc_sp.bench import cli, decide

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted(ROOT.glob("docs/*.md"))}
PAGES = {"README.md": README, **DOCS}
SHOWN = re.compile(r"```text\n\$ (mhc-sp-bench show (\S+))\n(.*?)```", re.S)


def readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_readme_opens_with_the_setup_and_test_commands():
    assert README.index("```bash") < README.index("## "), "the two commands must come first"
    main_job, tests = readme_commands()
    assert main_job.startswith("bash scripts/bootstrap.sh && ") and "mhc-sp-bench" in main_job
    assert tests.startswith("bash scripts/bootstrap.sh && ") and "pytest" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    _, tests = readme_commands()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci, ".ci/run must run the README's test command verbatim"


def test_readme_is_short_and_gets_to_a_measured_result():
    lines = README.splitlines()
    assert len(lines) < 200
    first_result = next(i for i, line in enumerate(lines) if line.startswith("$ mhc-sp-bench show"))
    assert first_result < 150
    for section in ("## What it is", "## What `fused_layer` does", "## Status", "engine"):
        assert section in README
    # The status says what a GPU has shown, with the record behind it.
    assert "bench/results/gpu_check_h200.json" in README


def test_readme_points_to_the_design_in_the_repository():
    assert "docs/design.md" in README
    assert (ROOT / "docs" / "design.md").is_file()


def test_paths_the_readme_and_docs_name_exist():
    tops = ("csrc/", "python/", "tests/", "bench/", "docs/", "scripts/", "examples/", ".ci/")
    named = {
        m for text in PAGES.values() for m in re.findall(r"`([^`\s]+)`", text) if m.startswith(tops)
    }
    assert len(named) >= 10, named
    missing = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert not missing, f"files named that do not exist: {missing}"
    links = {
        (page, m)
        for page, text in PAGES.items()
        for m in re.findall(r"\]\(([^)#]+)\)", text)
        if not m.startswith("http")
    }
    broken = sorted(
        (page, m) for page, m in links if not (ROOT / Path(page).parent / m).resolve().exists()
    )
    assert not broken, broken


def bench_commands(text: str) -> list[list[str]]:
    """The argument lists of every mhc-sp-bench command in ``text``: in code blocks (one per
    line, continuation lines joined, comments dropped) and in inline code."""
    commands = []
    for block in re.findall(r"```(?:bash|text)?\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ")[0].split("#  ")[0]
            if "mhc-sp-bench" in line and not line.startswith("#"):
                commands.append(line.split("mhc-sp-bench", 1)[1])
    outside = re.sub(r"```.*?```", "", text, flags=re.S)
    commands += [m for m in re.findall(r"`(?:\.venv/bin/)?mhc-sp-bench([^`]*)`", outside)]
    return [shlex.split(c) for c in commands]


def script_commands() -> list[list[str]]:
    text = (ROOT / "bench" / "cpu_bench.sh").read_text().replace("\\\n", " ")
    text = text.replace("$R", "bench/results")
    return [shlex.split(m) for m in re.findall(r"^\S*\s*\$BENCH (.*)$", text, re.M)]


def test_every_command_in_the_readme_and_docs_parses(monkeypatch):
    monkeypatch.chdir(ROOT)  # the files they name are relative to the repository
    commands = [argv for text in PAGES.values() for argv in bench_commands(text)]
    commands += script_commands()
    assert len(commands) >= 20
    for argv in commands:
        try:
            cli.parse_args(argv)
        except SystemExit as e:  # --version and --help exit 0 after printing
            if e.code != 0:
                pytest.fail(f"mhc-sp-bench {shlex.join(argv)} does not parse")
    subprocess.run(["bash", "-n", str(ROOT / "bench" / "cpu_bench.sh")], check=True)


def test_every_result_shown_is_what_show_prints(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    shown = [(page, *m) for page, text in PAGES.items() for m in SHOWN.findall(text)]
    assert {page for page, *_ in shown} >= {"README.md", "docs/benchmarks.md"}
    for page, command, path, block in shown:
        assert json.loads((ROOT / path).read_text())["command"]
        assert cli.main(shlex.split(command)[1:]) == 0
        assert capsys.readouterr().out == block, f"{page}: {command} prints something else"


def test_peer_ratios_quoted_come_from_the_recorded_file():
    doc = json.loads((ROOT / "bench" / "results" / "cpu_vs_peer.json").read_text())
    ratios = {(r["tokens"], r["hidden"], r["op"]): r["ratio"] for r in doc["rows"]}
    text = DOCS["docs/cpu-kernels.md"]
    assert doc["command"] in text
    rows = re.findall(r"^\| T=(\d+), H=(\d+) \| (.*) \|$", text, re.M)
    assert len(rows) == 3
    for T, H, cells in rows:
        quoted = [float(c.strip().rstrip("x")) for c in cells.split("|")]
        recorded = [ratios[int(T), int(H), op] for op in ("post", "pre", "post_pre", "head")]
        assert quoted == [round(r, 2) for r in recorded]


def test_the_recorded_nvtx_summary_in_the_docs_is_the_files():
    """docs/profiling-nvtx.md quotes bench/results/cpu_layer_nvtx_record.json row by row: range,
    count, total (ms, one decimal) and mean (us, whole)."""
    doc = DOCS["docs/profiling-nvtx.md"]
    start = doc.index("`bench/results/cpu_layer_nvtx_record.json` holds one")
    shown = re.findall(r"^\| `([^`]+)` \| (\d+) \| ([\d.]+) \| (\d+) \|$", doc[start:], re.M)
    recorded = json.loads((ROOT / "bench/results/cpu_layer_nvtx_record.json").read_text())
    assert recorded["unclosed_ranges"] == 0 and recorded["unmatched_pops"] == 0
    want = [
        (r["range"], str(r["count"]), f"{r['total_us'] / 1000:.1f}", f"{r['mean_us']:.0f}")
        for r in recorded["ranges"]
    ]
    assert shown == want


def test_the_stability_table_quotes_the_records():
    """docs/benchmarks.md's table of five identical tuner runs per command: each row's answers,
    ranges of thresholds that cost the same, load before each run and wall times are its
    record's (bench/tune_stability.sh), and every answer is today's rule's on that run's rows."""
    doc = DOCS["docs/benchmarks.md"]
    cell = r" \| ([^|]+)"
    rows = re.findall(
        r"^\| `(cpu_stability_\w+\.json)` \| `([^`]*)`" + cell * 4 + r" \|$", doc, re.M
    )
    assert {r[0] for r in rows} >= {
        f"cpu_stability_{name}.json"
        for name in ("h1024_tp2", "h4096_tp2", "h1024_tp3", "h4096_tp3", "bare")
    }
    for name, command, answers, same_cost, load, wall in rows:
        record = json.loads((ROOT / "bench" / "results" / name).read_text())
        runs = record["runs"]
        assert len(runs) == 5
        for run in runs:
            assert run["command"] == f"mhc-sp-bench {command} --json bench/results/{name}"
            capture = run["max_cudagraph_capture_size"]
            assert run["recommended_sp_threshold"] == decide.recommend(run["rows"], capture)
            assert run["same_cost_sp_thresholds"] == list(decide.same_cost(run["rows"], capture))
        assert answers.split() == [str(r["recommended_sp_threshold"]) for r in runs]
        assert same_cost.split() == ["{}-{}".format(*r["same_cost_sp_thresholds"]) for r in runs]
        assert load.split() == [f"{r['load_before'][0]:.1f}" for r in runs]
        assert wall.split() == [f"{r['wall_s']:.0f}" for r in runs]
        assert record["stability"]["recommended_sp_thresholds"] == [int(a) for a in answers.split()]
