"""Promises the repository makes outside the code: the README's commands are what CI runs, and
the README's torchrun example works."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_readme_opens_with_setup_and_test_commands_that_ci_runs():
    text = (ROOT / "README.md").read_text()
    assert text.index("```bash") < text.index("## "), "the two commands must come first"
    main_job, tests = readme_commands()
    assert main_job.startswith("bash scripts/bootstrap.sh && ") and "mhc-sp-bench" in main_job
    assert tests.startswith("bash scripts/bootstrap.sh && ") and "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in [line.strip() for line in ci], ".ci/run must run the README's test command verbatim"


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun not installed beside this python")
def test_torchrun_example_runs():
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    from mhc_sp.launch import free_port

    out = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
                          str(ROOT / "examples" / "sp_boundary.py"), "--tokens", "9"],
                         capture_output=True, text=True, timeout=180, env=env)
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
