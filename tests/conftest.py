import os
from pathlib import Path

import pytest
import torch

import mhc_sp  # noqa: F401  (registers the ops)

GOLDEN = Path(__file__).resolve().parents[2] / "shared" / "golden" / "mhc_v4_golden.pt"
GOLDEN = Path(os.environ.get("MHC_SP_GOLDEN", GOLDEN))


@pytest.fixture(scope="session")
def golden():
    if not GOLDEN.is_file():
        pytest.fail(f"golden data not found at {GOLDEN} (set MHC_SP_GOLDEN)")
    return torch.load(GOLDEN, weights_only=True)
