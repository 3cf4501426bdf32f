# SPDX-License-Identifier: Apache-2.0
"""Installing mhc_sp beside an engine's torch: the import-time guard against an extension built
for another torch (both ways, with the recorded build version faked), a build that could not see
the target environment's torch stopping before it compiles, and (slow) the README's wheel command
end to end: build the wheel, install it into a fresh environment that reuses the installed torch
without downloading anything, and run the CLI, an op and a layer from outside the source tree."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import mhc_sp

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
WHEEL_COMMAND = "pip wheel --no-build-isolation --no-deps ."
INSTALL_COMMAND = "pip install --no-build-isolation ."


def other_minor(version: str) -> str:
    """A torch version whose major.minor differs from ``version``'s."""
    major, minor = (int(v) for v in version.split(".")[:2])
    return f"{major}.{minor - 1 if minor > 0 else minor + 1}.0+cpu"


CPU_BUILD = {"torch_version": "2.14.1+cpu", "cuda": False, "cuda_runtime_built": None}
CUDA_BUILD = {"torch_version": "2.14.1+cu130", "cuda": True, "cuda_runtime_built": 13000}


@pytest.mark.parametrize(
    "built, running, cuda, problem",
    [
        (CPU_BUILD, "2.14.1+cpu", None, None),
        (CPU_BUILD, "2.14.3+cu130", "13.0", None),  # patch and CUDA flavour of a CPU build: fine
        (
            CPU_BUILD,
            "2.15.0a0+git1",
            None,
            "runs torch 2.15.0a0+git1 (the torch major.minor differs)",
        ),
        (CPU_BUILD, "3.14.0", None, "runs torch 3.14.0 (the torch major.minor differs)"),
        (CUDA_BUILD, "2.14.0+cu130", "13.2", None),
        (CUDA_BUILD, "2.14.1+cu128", "12.8", "with CUDA 12.8 (the CUDA major differs)"),
        (CUDA_BUILD, "2.14.1+cpu", None, "runs torch 2.14.1+cpu (CPU only) (the CUDA major"),
        (CUDA_BUILD, "2.13.0+cu126", "12.6", "(the torch major.minor and the CUDA major differ)"),
    ],
)
def test_build_mismatch_names_both_versions(built, running, cuda, problem):
    got = mhc_sp._build_mismatch(built, running, cuda)
    if problem is None:
        assert got is None
        return
    assert problem in got, got
    assert f"built against torch {built['torch_version']}" in got and f"runs torch {running}" in got
    assert mhc_sp.REINSTALL in got


# Run in a fresh interpreter: the extension can be loaded only once per process, so the three
# imports share one process. (1) _C fails to load, as one built for another torch does (a missing
# symbol); (2) _C loads but its recorded build version is another torch's: refused; (3) the same
# with the override set: imported with a warning, and an op runs and matches the reference.
GUARD_SCRIPT = r"""
import glob, importlib.abc, importlib.machinery, importlib.util, json, os, sys, types, warnings
import torch

out = {}
package = importlib.util.find_spec("mhc_sp").submodule_search_locations[0]

class BrokenExtension(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "mhc_sp._C":
            raise ImportError("undefined symbol: _ZN3c1017SymbolOfAnotherTorch")

sys.meta_path.insert(0, BrokenExtension())
try:
    import mhc_sp
except ImportError as e:
    out["unloadable"] = str(e)
sys.meta_path.pop(0)

(path,) = glob.glob(os.path.join(package, "_C.*.so"))
loader = importlib.machinery.ExtensionFileLoader("mhc_sp._C", path)
real = importlib.util.module_from_spec(importlib.util.spec_from_loader("mhc_sp._C", loader))
loader.exec_module(real)

class RecordedOtherTorch(types.ModuleType):
    def __getattr__(self, name):
        return getattr(real, name)

    def build_info(self):
        return {**real.build_info(), "torch_version": sys.argv[1]}

sys.modules["mhc_sp._C"] = RecordedOtherTorch("mhc_sp._C")
try:
    import mhc_sp
except ImportError as e:
    out["refused"] = str(e)
os.environ["MHC_SP_ALLOW_TORCH_MISMATCH"] = "1"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import mhc_sp
out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]

from mhc_sp import ops, reference
from mhc_sp.testing import assert_close, random_inputs
i = random_inputs(5, 4, 64, seed=1)
got = ops.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], i["norm_weight"])
want = reference.mhc_pre(i["residual"], i["fn"], i["scale"], i["base"], i["norm_weight"])
for name, a, b in zip(("post", "comb", "layer_input"), got, want):
    assert_close(a, b, name)
out["op"] = "ok"
print(json.dumps(out))
"""


def test_import_refuses_an_extension_built_for_another_torch_unless_overridden():
    built = other_minor(torch.__version__)
    env = {k: v for k, v in os.environ.items() if k != mhc_sp.ALLOW_MISMATCH_ENV}
    out = subprocess.run(
        [sys.executable, "-c", GUARD_SCRIPT, built],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    unloadable = result["unloadable"]
    assert f"does not load into torch {torch.__version__}" in unloadable
    assert "SymbolOfAnotherTorch" in unloadable and mhc_sp.REINSTALL in unloadable
    refused = result["refused"]
    assert f"built against torch {built}" in refused, refused
    assert f"this environment runs torch {torch.__version__}" in refused
    assert mhc_sp.REINSTALL in refused and f"{mhc_sp.ALLOW_MISMATCH_ENV}=1" in refused
    (warning,) = result["warnings"]
    problem = refused.split("  (to import it anyway")[0]
    assert warning == f"RuntimeWarning: {problem}  (imported anyway: {mhc_sp.ALLOW_MISMATCH_ENV}=1)"
    assert result["op"] == "ok"


def source_copy(dest: Path) -> Path:
    """The tree as a fresh clone would hold it (tracked files and new ones git does not ignore),
    without build outputs."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


# A build that cannot import torch, as in pip's isolated build environment (torch is not a build
# requirement): the PEP 517 backend, with every import of torch refused.
NO_TORCH_BUILD = r"""
import importlib.abc, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoTorch())
from setuptools import build_meta
build_meta.build_wheel(sys.argv[1])
"""


def check_stop_message(output: str) -> None:
    assert "mhc_sp: no torch to build against" in output, output
    assert "cannot see that environment" in output
    assert INSTALL_COMMAND in output and WHEEL_COMMAND in output
    # Nothing was configured or compiled.
    assert not re.search(r"Build files have been written|Building CXX object|\[\d+/\d+\]", output)


def test_a_build_without_the_target_torch_stops_before_compiling(tmp_path):
    src = tmp_path / "src"
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "python", src / "python", ignore=shutil.ignore_patterns("*.so", "*egg*"))
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH_BUILD, str(tmp_path / "wheels")],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    check_stop_message(out.stdout + out.stderr)
    assert time.monotonic() - start < 60
    assert not (tmp_path / "wheels").exists() or not any((tmp_path / "wheels").iterdir())


def test_the_readme_gives_the_install_and_wheel_commands():
    section = README[README.index("## Into an existing environment") :]
    section = section[: section.index("\n## ", 1)]
    assert INSTALL_COMMAND in section and WHEEL_COMMAND in section
    assert "MHC_SP_CUDA=1" in section and "TORCH_CUDA_ARCH_LIST" in section
    assert mhc_sp.ALLOW_MISMATCH_ENV in section
    # Right after the two opening commands: the first section after the bootstrap paragraph.
    assert README.index("## Into an existing environment") < README.index("## What it is")


# ---- the install path, end to end (slow: compiles the extension) -------------------------------


def run(cmd, transcript: list, cwd, env, timeout=1800, check=True):
    """Run ``cmd`` (a list) and add it and its output to ``transcript``."""
    start = time.monotonic()
    out = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    transcript.append(
        {
            "command": " ".join(str(c) for c in cmd),
            "cwd": str(cwd),
            "returncode": out.returncode,
            "seconds": round(time.monotonic() - start, 1),
            "output": (out.stdout + out.stderr)[-6000:],
        }
    )
    if check:
        assert out.returncode == 0, transcript[-1]
    return out


def clean_env(**extra) -> dict:
    """This environment without mhc_sp's switches and Python's and pip's settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MHC_SP_", "PYTHON", "PIP_")) and k != "VIRTUAL_ENV"
    }
    return {**env, **extra}


def reach_installed_torch(venv_site: Path, shadow: Path) -> Path:
    """Make ``venv_site``'s environment see the installed torch (and what it depends on) without
    copying or downloading it: ``shadow`` holds links to every entry of torch's site-packages
    except mhc_sp's own, and a .pth file puts it on the new environment's path."""
    torch_site = Path(torch.__file__).resolve().parent.parent
    shadow.mkdir()
    for entry in torch_site.iterdir():
        if entry.name.startswith(("mhc_sp", "__editable__")) or entry.suffix == ".pth":
            continue
        (shadow / entry.name).symlink_to(entry)
    (venv_site / "_installed_torch.pth").write_text(f"{shadow}\n")
    return torch_site


@pytest.mark.slow
def test_an_isolated_pip_build_stops_before_compiling(tmp_path):
    """pip's default, build isolation, for real: it installs the build requirements into a
    temporary environment (from the package index or pip's cache) and then stops with the
    message, without compiling."""
    src = source_copy(tmp_path / "src")
    transcript = []
    out = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", ".", "-w", tmp_path / "wheels"],
        transcript,
        src,
        clean_env(),
        timeout=600,
        check=False,
    )
    output = out.stdout + out.stderr
    if "mhc_sp:" not in output and "Could not find a version" in output:
        pytest.skip("the package index does not offer the build requirements here")
    assert out.returncode != 0
    check_stop_message(output)
    record("isolated", transcript, tmp_path)


RECORD_COMMAND = (
    "MHC_SP_INSTALL_RECORD=bench/results/install.json bash scripts/slow_tests.sh -k test_install"
)


def record(part: str, transcript: list, tmp_path: Path) -> None:
    """With MHC_SP_INSTALL_RECORD=FILE, keep this test's transcript in FILE (JSON, one key per
    test) for bench/results, with the test's folder written $TMP and the source tree's ".".
    """
    path = os.environ.get("MHC_SP_INSTALL_RECORD")
    if not path:
        return
    doc = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
    doc.update(command=RECORD_COMMAND, torch=torch.__version__)
    text = json.dumps(transcript).replace(str(tmp_path), "$TMP").replace(str(ROOT), ".")
    doc[part] = json.loads(text)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


ONE_OP = """
import torch, mhc_sp
from mhc_sp import ops, reference
from mhc_sp.testing import assert_close, random_inputs
i = random_inputs(7, 4, 256, seed=0)
got = ops.mhc_post(i["x"], i["residual"], i["post"], i["comb"])
assert_close(got, reference.mhc_post(i["x"], i["residual"], i["post"], i["comb"]), "mhc_post")
print("mhc_sp", mhc_sp.__file__)
print("torch", torch.__version__, torch.__file__)
print("build", mhc_sp.build_info())
print("mhc_post (7, 4, 256) against the reference: OK")
"""


@pytest.mark.slow
def test_wheel_installs_into_an_environment_with_its_own_torch(tmp_path):
    """The README's wheel command, the wheel installed into a fresh virtual environment that
    reaches the already installed torch (pip runs with --no-index: nothing can be downloaded),
    and the CLI, an op and a tp=2 layer run from a folder outside the source tree."""
    src = source_copy(tmp_path / "src")
    wheels, venv, outside = tmp_path / "wheels", tmp_path / "engine-env", tmp_path / "elsewhere"
    outside.mkdir()
    transcript = []
    build_env = clean_env(MHC_SP_CUDA=os.environ.get("MHC_SP_CUDA", "0"), MAX_JOBS="2")
    assert WHEEL_COMMAND == "pip wheel --no-build-isolation --no-deps ."
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-w",
            wheels,
            ".",
        ],
        transcript,
        src,
        build_env,
    )
    (wheel,) = wheels.glob("mhc_sp-*.whl")

    # --without-pip: pip, setuptools and the rest come from the environment reached below, so
    # the new one holds the same versions of everything as the environment with the torch.
    run([sys.executable, "-m", "venv", "--without-pip", venv], transcript, outside, clean_env())
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    torch_site = reach_installed_torch(site, tmp_path / "installed-torch")
    # No index and no configuration file (which may name folders of wheels): pip can only use
    # what is installed, and fails rather than fetch anything.
    env = clean_env(PIP_CONFIG_FILE=os.devnull)
    run([python, "-m", "pip", "install", "--no-index", wheel], transcript, outside, env)

    version = run([venv / "bin" / "mhc-sp-bench", "--version"], transcript, outside, env)
    assert version.stdout.startswith("mhc-sp-bench ") and torch.__version__ in version.stdout
    op = run([python, "-c", ONE_OP], transcript, outside, env)
    lines = dict(line.split(" ", 1) for line in op.stdout.splitlines())
    assert lines["mhc_sp"].startswith(str(site)), "imported another mhc_sp than the wheel's"
    assert (
        torch.__version__ in lines["torch"] and str(tmp_path / "installed-torch") in lines["torch"]
    )
    assert str(torch_site) != str(site)
    layer = run(
        [
            venv / "bin" / "mhc-sp-bench",
            "layer",
            "-tp",
            "2",
            "--tokens",
            "4",
            "--hidden-size",
            "256",
        ],
        transcript,
        outside,
        env,
        timeout=600,
    )
    assert "4" in layer.stdout
    record("wheel", transcript, tmp_path)


def setup_functions() -> dict:
    """setup.py's helpers, without running setup() (its last statement)."""
    source = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    namespace = {"__file__": str(Path(__file__).resolve().parents[2] / "setup.py")}
    exec(compile(source[: source.index("\nsetup(")], "setup.py", "exec"), namespace)
    return namespace


def test_the_build_links_the_processes_shared_libstdcxx_and_refuses_a_module_without_it():
    helpers = setup_functions()
    runtime = Path(helpers["_runtime_libstdcxx"]())
    assert runtime.name.startswith("libstdc++.so") and runtime.is_file(), runtime
    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed: the build's check is skipped too")
    module = Path(mhc_sp._C.__file__)
    helpers["_check_shared_libstdcxx"]([module])  # the built module passes
    recorder = module.with_name("libmhc_sp_nvtx_record.so")  # C: no libstdc++ in it
    if not recorder.is_file():
        pytest.skip("built without the NVTX recorder, the one module here without libstdc++")
    with pytest.raises(helpers["SetupError"], match="^libmhc_sp_nvtx_record.so: linked without"):
        helpers["_check_shared_libstdcxx"]([recorder])


def test_each_build_ships_its_own_modules_and_nothing_left_from_another(tmp_path):
    # setuptools' build_lib is shared by every configuration: a sanitizer build whose modules
    # ninja found up to date shipped the other sanitizer's modules. CMake links into the
    # configuration's own folder, and _deliver copies from there after every build.
    deliver = setup_functions()["_deliver"]
    known = ["_C.so", "rec.so", "_testing.so", "_emulated.so"]
    address, thread, out = tmp_path / "address", tmp_path / "thread", tmp_path / "build_lib"
    for folder in (address, thread):
        folder.mkdir()
        for name in known:
            (folder / name).write_text(folder.name)
    deliver(thread, out, known, known)
    deliver(address, out, ["_C.so", "rec.so"], known)  # a build without the test-only modules
    assert sorted(p.name for p in out.iterdir()) == ["_C.so", "rec.so"]
    assert {p.read_text() for p in out.iterdir()} == {"address"}
    (address / "rec.so").unlink()  # not built this time: the earlier copy goes too
    deliver(address, out, ["_C.so", "rec.so"], known)
    assert sorted(p.name for p in out.iterdir()) == ["_C.so"]
