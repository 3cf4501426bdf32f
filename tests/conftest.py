# SPDX-License-Identifier: Apache-2.0
import importlib.util
import os
from pathlib import Path

import pytest

import mhc_sp  # noqa: F401  (registers the ops)

DATA = Path(__file__).resolve().parent / "data"

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
