# SPDX-License-Identifier: Apache-2.0
"""How far two TP sizes of the same model may differ (``mhc-sp-bench model --check``, tests)."""

from __future__ import annotations

from torch import Tensor


def logits_tolerance(num_layers: int, reference: Tensor) -> float:
    """Largest fair ``max |logits - reference|`` between two TP sizes of the same model.

    Each TP rank rounds its partial sums to bf16 before they are reduced, so tp > 1 differs from
    tp = 1 by about one bf16 ulp per boundary; the differences add up like a random walk over the
    layers. Measured on the tiny preset: 0.03-0.05 at 2-4 layers and ~0.11 at 16 layers for logits
    of magnitude ~4, i.e. well under half of this bound; a wrong slice or a padding leak gives
    errors of the logits' own magnitude. (Compare with routing replayed — see
    ``mhc_sp.engine.model.RoutingTrace`` — since a near-tie expert choice can flip under any TP
    size.)
    """
    scale = max(1.0, float(reference.abs().max())) if reference.numel() else 1.0
    return 0.015 * (num_layers + 1) ** 0.5 * scale
