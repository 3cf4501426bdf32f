# SPDX-License-Identifier: Apache-2.0
"""mhc_sp: sequence-parallel DeepSeek-V4 mHC residual stream as fused torch custom ops.

Importing the package registers ``torch.ops.mhc_sp.*`` (C++/CUDA kernels) and their fake
implementations. See ``mhc_sp.ops`` for the typed Python API.
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from . import (
    _C,  # noqa: F401  (registers the ops)
    _fake,  # noqa: F401  (registers the fake implementations)
)
from .config import MhcConfig

__all__ = ["MhcConfig", "build_info"]


def build_info() -> dict:
    """How the extension was built: torch version, CPU kernel ISA, NVTX ranges (``nvtx``), CUDA,
    arch list (comma-joined, e.g. "9.0a,10.0a"), NCCL version."""
    return dict(_C.build_info())
