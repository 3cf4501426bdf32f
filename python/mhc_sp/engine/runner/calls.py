# SPDX-License-Identifier: Apache-2.0
"""What every runner call shares: checking token ids, padding rows to a plan's count, and the
per-phase timings it returns."""

from __future__ import annotations

import time
from typing import Optional

import torch
from torch import Tensor

from ...profiling import PhaseTimer

#: Token id of padding rows. Padding rows follow the real ones and attention is causal, so they
#: never reach a real token's logits; the runner trims them off.
PAD_TOKEN_ID = 0


def check_token_ids(ids, name: str, vocab_size: int, device: torch.device) -> Tensor:
    """``ids`` on ``device``; raises ValueError naming ``name`` unless it is a non-empty 1-D int64
    tensor of ids in ``[0, vocab_size)``."""
    if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype != torch.int64:
        raise ValueError(
            f"{name}: expected a 1-D int64 tensor of token ids, got "
            f"{getattr(ids, 'dtype', type(ids).__name__)} {tuple(getattr(ids, 'shape', ()))}"
        )
    if ids.numel() == 0:
        raise ValueError(f"{name}: expected at least one token, got 0")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(
            f"{name}: expected token ids in [0, {vocab_size}), got values in [{lo}, {hi}]"
        )
    return ids.to(device)


def pad_rows(t: Tensor, rows: int, value) -> Tensor:
    """``t`` with rows of ``value`` appended up to ``rows`` rows."""
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_full((rows - t.shape[0], *t.shape[1:]), value)])


class CallTimer:
    """The phase timer of one runner call (the caller's, or a new one) and its wall time."""

    def __init__(self, timer: Optional[PhaseTimer], device: torch.device):
        self.device = device
        self.timer = timer if timer is not None else PhaseTimer(sync_cuda=device.type == "cuda")
        self.start = time.perf_counter()

    def finish(self) -> dict[str, float]:
        """Seconds per phase, and ``total`` for the whole call (after the device is idle)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        timings = dict(self.timer.totals) if isinstance(self.timer, PhaseTimer) else {}
        timings["total"] = time.perf_counter() - self.start
        return timings
