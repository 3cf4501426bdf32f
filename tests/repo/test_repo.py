# SPDX-License-Identifier: Apache-2.0
"""Promises the repository makes outside the code: it names nothing outside itself, the torchrun
example works, the CUDA build's targets, the GPU check script's shape and time budget, and the
tests' own layout (one folder per subject, the cuda marker on every test in tests/cuda)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: The tests' subject folders (tests/conftest.py puts each on sys.path and marks tests/cuda).
SUBJECTS = ("ops", "transport", "model", "cli", "repo", "cuda", "emulated")


@pytest.mark.distributed
@pytest.mark.skipif(
    shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
    reason="torchrun not installed beside this python",
)
def test_torchrun_example_runs():
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    from mhc_sp.launch import free_port

    out = subprocess.run(
        [
            torchrun,
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            str(ROOT / "examples" / "sp_boundary.py"),
            "--tokens",
            "9",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(": OK") == 2


@pytest.mark.cuda  # reads the CUDA build
def test_cuda_build_targets_hopper_and_blackwell():
    import mhc_sp

    info = mhc_sp.build_info()
    if not info["cuda"]:
        pytest.skip("built without CUDA")
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        pytest.skip("arch list chosen by TORCH_CUDA_ARCH_LIST")
    assert info["cuda_arch_list"] == "9.0a,10.0a"


def gpu_check_text() -> str:
    return (ROOT / "bench" / "gpu_check.sh").read_text()


def test_gpu_check_script_parses_and_fits_its_time_budget():
    script = ROOT / "bench" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    limits = {
        k: int(v)
        for k, v in re.findall(r"^(T_[A-Z]+)=\$\{T_[A-Z]+:-(\d+)\}", gpu_check_text(), re.M)
    }
    total = limits.pop("T_TOTAL")
    assert {"T_BUILD", "T_TESTS", "T_SIM", "T_WORLD", "T_SANITIZER", "T_BENCH"} <= limits.keys()
    # Every step's own limit fits in the script's, which leaves a rerun inside 15 GPU minutes.
    assert sum(limits.values()) <= total < 8 * 60, limits


# bench/gpu_check.sh's steps, most valuable first: build, CUDA op tests, the symm checks, memcheck,
# timings last.
GPU_CHECK_STEPS = [
    "build",
    "build_info",
    "cubin_gate",
    "cuda_tests",
    "symm_sim",
    "symm_world",
    "memcheck",
    "symm_timings",
    "op_bench",
]


def test_gpu_check_script_orders_its_steps_by_value():
    names = re.findall(r"^\s*(?:if ! )?step (\w+) ", gpu_check_text(), re.M)
    assert names == GPU_CHECK_STEPS


def test_gpu_check_script_runs_every_cuda_test_file():
    text = gpu_check_text()
    cuda_files = sorted(p.relative_to(ROOT).as_posix() for p in TESTS.glob("cuda/test_*.py"))
    assert cuda_files
    missing = [name for name in cuda_files if name not in text]
    assert not missing, missing


def test_gpu_check_script_records_skipped_steps_as_not_ok(tmp_path):
    """A step that cannot run is "skipped" in summary.json and the summary is not ok: run the
    script with a python that fails the build at once (no GPU needed)."""
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = "-" ]; then exec {sys.executable} "$@"; fi\nexit 7\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=str(fake), OUT=str(out), PATH="/usr/bin:/bin")
    subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh")],
        env=env,
        timeout=60,
        capture_output=True,
        check=False,
    )
    import json

    summary = json.loads((out / "summary.json").read_text())
    status = {s["name"]: s["status"] for s in summary["steps"]}
    assert status["build"] == "failed" and summary["ok"] is False
    assert [k for k, v in status.items() if v == "skipped"] == GPU_CHECK_STEPS[1:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log", "summary.json"]


def test_gpu_check_script_python_and_benchmark_flags_are_valid():
    """What only a GPU machine runs must at least compile and parse here."""
    from mhc_sp.bench import cli

    text = gpu_check_text()
    snippets = re.findall(r"\"\$PY\" -c '(.*?)'\n", text, re.S)
    assert len(snippets) >= 2
    for code in snippets:
        compile(code, "gpu_check.sh", "exec")
    joined = text.replace("\\\n", " ")
    (bench,) = re.findall(r"^step op_bench .*? -m mhc_sp\.bench (ops .*?)$", joined, re.M)
    argv = shlex.split(re.sub(r"\$\(\([^)]*\)\)|\$\w+|\$\{\w+\}", "1", bench))
    args = cli.build_parser().parse_args(argv)
    assert args.device == "cuda" and args.budget_s > 0 and args.json


def tracked_text_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for name in out.stdout.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" not in data:
            yield name, data.decode("utf-8", errors="replace")


def test_no_tracked_file_names_a_path_outside_the_repository_or_an_issue():
    patterns = {
        "a sibling folder": r"\.\./shared",
        "an absolute machine path": r"/wor[k]/",
        "an issue": r"(?i)\bissues?\s*#?\d+",
    }
    found = [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {what} ({m.group(0)!r})"
        for name, text in tracked_text_files()
        for what, pattern in patterns.items()
        for m in re.finditer(pattern, text)
    ]
    assert not found, "\n".join(found)


def test_every_test_file_lives_in_a_subject_folder():
    """tests/ holds conftest.py, data/ and one folder per subject; every module is in one, its
    basename unique (tests import each other by bare name) and its folder on sys.path."""
    modules = sorted(p.relative_to(TESTS) for p in TESTS.rglob("*.py"))
    stray = [
        p.as_posix()
        for p in modules
        if p.parts[0] != "data" and p != Path("conftest.py")
        if len(p.parts) != 2 or p.parts[0] not in SUBJECTS
    ]
    assert not stray, f"test modules outside the subject folders {SUBJECTS}: {stray}"
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert folders == {*SUBJECTS, "data"}, folders
    assert all(any(TESTS.glob(f"{s}/test_*.py")) for s in SUBJECTS)
    names = [p.name for p in modules if p.parts[0] in SUBJECTS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert all(str(TESTS / s) in sys.path for s in SUBJECTS), "tests/conftest.py: sys.path"


def test_every_test_in_tests_cuda_carries_the_cuda_marker(request):
    """From the tests this session collected when it collected tests/cuda (the default run), else
    from a collection of tests/cuda alone."""
    cuda = TESTS / "cuda"
    items = [i for i in request.session.items if cuda in Path(i.path).resolve().parents]
    if items:
        unmarked = [i.nodeid for i in items if i.get_closest_marker("cuda") is None]
        assert not unmarked, unmarked
        return
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-m", "not cuda"]
        + [str(cuda)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 5, out.stdout + out.stderr  # 5: no test selected
    assert "::" not in out.stdout, out.stdout
