# SPDX-License-Identifier: Apache-2.0
"""The tree passes its own linters: ruff (config in pyproject.toml) over the Python, clang-format
(.clang-format) over the C++/CUDA. scripts/bootstrap.sh installs both into .venv; a checkout
without them skips."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CXX_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")


def tool(name: str) -> str:
    beside_python = Path(sys.executable).parent / name
    found = str(beside_python) if beside_python.is_file() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (scripts/bootstrap.sh installs it)")
    return found


def tracked(*patterns: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.split()


def test_ruff_check_passes():
    run = subprocess.run(
        [tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_clang_format_passes():
    files = [f for f in tracked("csrc") if f.endswith(CXX_SUFFIXES)]
    assert files, "no C++ sources found"
    run = subprocess.run(
        [tool("clang-format"), "--dry-run", "-Werror", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-4000:]


def test_every_source_file_carries_the_license_tag():
    sources = [
        f
        for f in tracked()
        if f.endswith(CXX_SUFFIXES + (".py", ".sh")) or f in (".ci/run", "CMakeLists.txt")
    ]
    untagged = [
        f
        for f in sources
        if "SPDX-License-Identifier: Apache-2.0" not in "".join((ROOT / f).open().readlines()[:3])
    ]
    assert not untagged, f"files without an SPDX line: {untagged}"
