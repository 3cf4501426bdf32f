# SPDX-License-Identifier: Apache-2.0
"""Promises the repository makes outside the code: it names nothing outside itself, the torchrun
example works, the CUDA build's targets, and the tests' own layout (one folder per subject, the
cuda marker on every test in tests/cuda). The GPU check script: tests/repo/test_gpu_check.py."""

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import SUBJECTS

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: Where Python modules import one another: the tests, the scripts in bench/, the examples.
CODE_FOLDERS = ("tests", "bench", "examples")
#: A change to sys.path: a call that adds to it, or an assignment to it or to a slice of it.
SYS_PATH_EDIT = re.compile(r"sys\.path\s*(\.(insert|append|extend)\(|(\[[^\]]*\])?\s*\+?=(?!=))")


@pytest.mark.distributed
@pytest.mark.skipif(
    shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
    reason="torchrun not installed beside this python",
)
def test_torchrun_example_runs():
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    from mhc_sp.local_world import free_port

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
    """tests/ holds its package's __init__.py, conftest.py, data/, helpers/ and one package per
    subject; every module is in one of them, every subject has tests and helpers/ has none, and
    module basenames are unique (a file named in the docs, a script or a failure line is one
    file). No subject folder is on sys.path: modules are imported by their path from the root."""
    top = {"__init__.py", "conftest.py"}
    modules = sorted(p.relative_to(TESTS) for p in TESTS.rglob("*.py"))
    stray = [
        p.as_posix()
        for p in modules
        if p.parts[0] != "data" and p.as_posix() not in top
        if len(p.parts) != 2 or p.parts[0] not in (*SUBJECTS, "helpers")
    ]
    assert not stray, f"test modules outside the subject folders {SUBJECTS} and helpers: {stray}"
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert folders == {*SUBJECTS, "helpers", "data"}, folders
    packages = ("", *SUBJECTS, "helpers")
    assert all((TESTS / s / "__init__.py").is_file() for s in packages), "an __init__.py missing"
    assert all(any(TESTS.glob(f"{s}/test_*.py")) for s in SUBJECTS)
    assert not any(TESTS.glob("helpers/test_*.py")), "tests in tests/helpers"
    names = [p.name for p in modules if p.parts[0] in (*SUBJECTS, "helpers")]
    names = [n for n in names if n != "__init__.py"]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert not any(str(TESTS / s) in sys.path for s in (*SUBJECTS, "helpers")), sys.path


def test_modules_import_each_other_by_package_path():
    """No module of tests/, bench/ or examples/ imports another of them by its bare name (``import
    hosts``, ``from test_sp_ops import ...``): the tests' modules are ``tests.<package>.<module>``,
    the examples ``examples.<module>``. Nothing changes sys.path to that end, and nothing in bench/
    or examples/ imports the tests (a script that runs the tests' scenarios is a module of tests/,
    run with ``python -m``)."""
    local = {p.stem for d in CODE_FOLDERS for p in (ROOT / d).rglob("*.py")}
    local -= {"__init__", "conftest"}
    bare, path_edits, tests_imported = [], [], []
    for d in CODE_FOLDERS:
        for path in sorted((ROOT / d).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            text = path.read_text()
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                else:
                    continue
                bare += [f"{where}:{node.lineno}: {n}" for n in names if n.split(".")[0] in local]
                if d != "tests":  # benchmarks and examples import the product, not the tests
                    outside = [n for n in names if n.split(".")[0] == "tests"]
                    tests_imported += [f"{where}:{node.lineno}: {n}" for n in outside]
            lines = [text.count("\n", 0, m.start()) + 1 for m in SYS_PATH_EDIT.finditer(text)]
            path_edits += [f"{where}:{line}" for line in lines]
    assert not bare, "imports by bare name:\n" + "\n".join(bare)
    assert not path_edits, "sys.path changed in: " + ", ".join(path_edits)
    assert not tests_imported, "the tests imported by: " + ", ".join(tests_imported)


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
