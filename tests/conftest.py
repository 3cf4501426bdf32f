# SPDX-License-Identifier: Apache-2.0
"""What every test folder shares: the test folders on sys.path, the markers that follow from a
test's folder, the hypothesis profiles and the golden-data fixtures.

The tests are grouped by subject, one folder each (SUBJECTS); tests/data holds the golden data.
Test modules and helpers import each other by bare name (``from dist_harness import run_world``,
``from test_sp_ops import worker_fused_ops``), also across folders, so every subject folder goes
on sys.path here, before any test module is imported. Ranks started with multiprocessing (spawn
or forkserver) get the parent's sys.path and so find the same modules; a helper run as a script
puts the folders it needs on sys.path itself (transport/hosts_harness.py). Module basenames are
unique across the folders (tests/repo/test_repo.py checks it)."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

import mhc_sp  # noqa: F401  (registers the ops)

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"

#: The subject folders, each holding the tests (and their helpers) of one subject:
#: ops (the math ops and their kernels on CPU), transport (collectives, the fused SP ops, shm,
#: gloo and symm host logic, faults, separate hosts, worlds of 8), model (model, runner, plan,
#: configuration), cli (mhc-sp-bench, tune, NVTX profiling), repo (README, docs, lint, repository
#: promises), cuda (everything that needs a GPU or reads the CUDA build) and emulated (the CUDA
#: device code run on the host, mhc_sp._emulated).
SUBJECTS = ("ops", "transport", "model", "cli", "repo", "cuda", "emulated")

#: Folders whose every test gets the marker: cuda needs a GPU or reads the CUDA build; emulated
#: runs the device code on the emulated device (pytest -m emulated runs those alone).
FOLDER_MARKERS = {"cuda": "cuda", "emulated": "emulated"}

for _subject in reversed(SUBJECTS):
    if str(TESTS / _subject) not in sys.path:
        sys.path.insert(0, str(TESTS / _subject))


def subject_of(path) -> str | None:
    """The subject folder a test file lives in (None: not in one)."""
    try:
        parts = Path(path).resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 and parts[0] in SUBJECTS else None


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = FOLDER_MARKERS.get(subject_of(item.path))
        if marker is not None:
            item.add_marker(marker)


try:  # the CUDA tests need no hypothesis, and a GPU machine may not have it
    from hypothesis import HealthCheck, settings
except ImportError:
    settings = None

if settings is not None:
    # "ci" (the default): fewer examples, fixed seeds so that a run can be repeated exactly, and
    # no per-example deadline (a shared machine's pauses are not failures). "dev": hypothesis'
    # own random search with more examples; pick it with HYPOTHESIS_PROFILE=dev.
    settings.register_profile(
        "ci",
        max_examples=40,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile(
        "dev", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def golden_module():
    """tests/data/mhc_golden.py: the float64 generator and loader of the golden data."""
    return _load_module("mhc_golden", DATA / "mhc_golden.py")


@pytest.fixture(scope="session")
def golden(golden_module):
    """The in-repository golden data (see tests/data/mhc_golden.py)."""
    return golden_module.load()


@pytest.fixture(scope="session")
def external_golden():
    """An extra golden file named by MHC_SP_GOLDEN, in the layout the in-repository one replaced:
    ``cases[k]`` with ``inputs`` and one entry per op. Skips when the variable is unset."""
    path = os.environ.get("MHC_SP_GOLDEN")
    if not path:
        pytest.skip("MHC_SP_GOLDEN is not set")
    import torch

    return torch.load(path, weights_only=True)
