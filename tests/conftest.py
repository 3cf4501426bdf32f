# SPDX-License-Identifier: Apache-2.0
"""What every test package shares: the markers that follow from a test's package, the hypothesis
profiles and the golden-data fixtures. The layout (one package per subject, helpers/, data/) is
described in tests/__init__.py; modules import each other by their path from the repository root
(``from tests.helpers.boundaries import worker_fused_ops``)."""

import gc
import importlib.util
import os
from pathlib import Path

import pytest

import mhc_sp  # noqa: F401  (registers the ops)
from tests import SUBJECTS

# The helpers' asserts report their operands as the tests' own do (must precede their import).
pytest.register_assert_rewrite("tests.helpers")

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"

#: Packages whose every test gets the marker: cuda needs a GPU or reads the CUDA build; emulated
#: runs the device code on the emulated device (pytest -m emulated runs those alone).
FOLDER_MARKERS = {"cuda": "cuda", "emulated": "emulated"}


def subject_of(path) -> str | None:
    """The subject folder a test file lives in (None: not in one)."""
    try:
        parts = Path(path).resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 and parts[0] in SUBJECTS else None


def pytest_collection_finish(session):
    """torch, hypothesis and the collected tests leave this process holding some 200 000 objects
    that live to its end; frozen, the garbage collector no longer walks them on every full
    collection (in a profile of the suite it took a sixth of this process's CPU time)."""
    gc.collect()
    gc.freeze()


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
