# SPDX-License-Identifier: Apache-2.0
"""Scripts a user runs (``torchrun --nproc-per-node 2 examples/sp_boundary.py``,
``python examples/engine_layer.py``); a package as well, so that the tests import them by path
from the repository root (``from examples import engine_layer``)."""
