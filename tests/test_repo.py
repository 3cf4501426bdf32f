# SPDX-License-Identifier: Apache-2.0
"""Promises the repository makes outside the code: it names nothing outside itself, the torchrun
example works, the CUDA build's targets, and the GPU check script's shape and time budget."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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


def test_cuda_build_targets_hopper_and_blackwell():
    import mhc_sp

    info = mhc_sp.build_info()
    if not info["cuda"]:
        pytest.skip("built without CUDA")
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        pytest.skip("arch list chosen by TORCH_CUDA_ARCH_LIST")
    assert info["cuda_arch_list"] == "9.0a,10.0a"


def test_gpu_check_script_parses_and_fits_its_time_budget():
    script = ROOT / "bench" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    limits = dict(re.findall(r"^(T_[A-Z]+)=\$\{T_[A-Z]+:-(\d+)\}", script.read_text(), re.M))
    assert {"T_BUILD", "T_TESTS", "T_BENCH"} <= limits.keys()
    assert sum(int(v) for v in limits.values()) < 8 * 60, limits


def test_gpu_check_script_python_and_benchmark_flags_are_valid():
    """What only a GPU machine runs must at least compile and parse here."""
    from mhc_sp.bench import cli

    text = (ROOT / "bench" / "gpu_check.sh").read_text()
    snippets = re.findall(r"\"\$PY\" -c '(.*?)'\n", text, re.S)
    assert len(snippets) >= 2
    for code in snippets:
        compile(code, "gpu_check.sh", "exec")
    joined = text.replace("\\\n", " ")
    (bench,) = re.findall(r"^step bench .*? -m mhc_sp\.bench (ops .*?)$", joined, re.M)
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
