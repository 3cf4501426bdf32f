# SPDX-License-Identifier: Apache-2.0
"""How one forward runs: the one place that decides padding, sequence parallelism and the CUDA
graph (docs/design.md §3).

Pure functions of the token count and the engine config. Every rank and every pipeline stage
calls them with the same arguments, so they always agree:

* a **main forward** of ``T`` tokens with SP on (``engine.sp_threshold`` set: tp > 1 and a
  threshold) and ``T >= sp_threshold`` is padded to ``P``, the next multiple of tp; it shards iff
  :func:`is_sharded` holds for ``P``;
* an **MTP draft step** decides on its own count, as the engine's draft layer does: it shards iff
  :func:`is_sharded` holds for ``T`` itself, and only a sharded step is padded (to a multiple of
  tp, rows the runner trims off again);
* otherwise, on CUDA with graphs on, a forward of at most ``max_cudagraph_capture_size`` tokens is
  padded to the next capture size and replayed from a CUDA graph. ``EngineConfig`` keeps the
  threshold above that size, so a captured size never shards.

The threshold is ``parallel.sp_threshold`` whether or not ``enforce_eager`` is set, never the
compile pass's ``sp_min_token_num``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..config import EngineConfig


def is_sharded(num_tokens: int, tp_size: int, sp_threshold: Optional[int]) -> bool:
    """THE sequence-parallel predicate: SP is on (``sp_threshold`` not None, ``tp_size > 1``),
    ``num_tokens >= sp_threshold`` and ``num_tokens >= tp_size``. A main forward applies it to its
    padded count, a draft step to its own count."""
    if sp_threshold is None or tp_size <= 1:
        return False
    return num_tokens >= sp_threshold and num_tokens >= tp_size


@dataclass(frozen=True)
class ForwardPlan:
    """How one forward runs: ``num_tokens`` real tokens padded to ``padded_tokens``; ``sharded``
    (SP engaged); ``graph_size``: the CUDA graph replayed (None: eager)."""

    num_tokens: int
    padded_tokens: int
    sharded: bool
    graph_size: Optional[int] = None


def plan_forward(
    num_tokens: int,
    engine: EngineConfig,
    device: torch.device | str = "cpu",
    *,
    draft: bool = False,
) -> ForwardPlan:
    """The :class:`ForwardPlan` of a main forward (or, with ``draft``, an MTP draft step) of
    ``num_tokens`` tokens under ``engine`` on ``device``."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens: expected a positive int, got {num_tokens!r}")
    tp, threshold = engine.parallel.tensor_parallel_size, engine.sp_threshold
    round_up = -(-num_tokens // tp) * tp
    if draft:
        sharded = is_sharded(num_tokens, tp, threshold)
        padded = round_up if sharded else num_tokens
    else:
        sp_on = threshold is not None and tp > 1
        padded = round_up if sp_on and num_tokens >= threshold else num_tokens
        sharded = is_sharded(padded, tp, threshold)
    graph_size = None
    if torch.device(device).type == "cuda" and engine.use_cudagraphs and not sharded:
        sizes = engine.compilation.cudagraph_capture_sizes()
        if num_tokens <= sizes[-1]:
            graph_size = next(s for s in sizes if s >= num_tokens)
            padded = graph_size
            if is_sharded(padded, tp, threshold):  # EngineConfig refuses such configs
                raise AssertionError(f"SP would engage on captured size {graph_size}")
    return ForwardPlan(num_tokens, padded, sharded, graph_size)
