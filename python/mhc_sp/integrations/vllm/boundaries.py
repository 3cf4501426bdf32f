# SPDX-License-Identifier: Apache-2.0
"""The fused boundaries of one vLLM model over its TP group, and their counts.

:class:`Boundaries` is the one place where the plugin calls mhc_sp's ops: the group, the
transport, the mHC constants and the per-forward ``sharded`` decision live here, and the model
(:mod:`.model`) only says which weights each boundary takes. A CUDA model would pass a CUDA
device and a CUDA transport here and keep the rest.

Counts: every forward records how many boundaries ran sharded and how many replicated (one
``fused_entry``, one ``fused_layer`` per sublayer boundary, one ``fused_head``). :func:`totals`
sums them for this process; with ``MHC_SP_VLLM_COUNTS=PATH`` each forward also appends one JSON
line ``{"rank", "tokens", "sharded", "sharded_boundaries", "replicated_boundaries"}`` to
``PATH.rank<r>.jsonl``.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Optional

import torch

from ... import ops
from ...config import MhcConfig
from ...distributed import init as init_group
from .options import Options, is_sharded

#: The environment variable naming the per-forward counts file (a prefix: one file per rank).
COUNTS_ENV = "MHC_SP_VLLM_COUNTS"

_lock = threading.Lock()
_totals = {"forwards": 0, "sharded_forwards": 0, "sharded": 0, "replicated": 0}


def totals() -> dict:
    """The boundary counts of this process, summed over its forwards."""
    with _lock:
        return dict(_totals)


class Boundaries:
    """mhc_sp's fused boundaries on one TP group (collective to build: every rank of the group).

    ``group``: the TP group's torch.distributed ProcessGroup (on CPU its gloo group);
    ``cfg``: the model's mHC constants. Call :meth:`begin` once per forward (it decides
    ``sharded``), then :meth:`entry`, :meth:`layer` for each sublayer boundary and :meth:`head`.
    """

    def __init__(
        self,
        group,
        rank: int,
        tp_size: int,
        options: Options,
        cfg: MhcConfig,
        device: str = "cpu",
    ):
        self.rank, self.tp_size, self.options, self.cfg = rank, tp_size, options, cfg
        self.device = device
        self.group = init_group(
            group, device=device, transport=options.transport, timeout=options.timeout
        )
        from ...distributed import transport

        self.transport = str(transport(self.group, device))
        self.sharded = False
        self.num_tokens = 0
        self._counts = [0, 0]  # sharded, replicated boundaries of the current forward
        self._file = None
        path = os.environ.get(COUNTS_ENV)
        if path:
            self._file = open(f"{path}.rank{rank}.jsonl", "a", buffering=1)

    # ---- one forward ------------------------------------------------------------------------

    def begin(self, num_tokens: int) -> bool:
        """Start a forward of ``num_tokens`` tokens: decide ``sharded`` (the same on every rank,
        for every boundary of this forward) and reset its counts."""
        self.num_tokens = int(num_tokens)
        self.sharded = is_sharded(self.num_tokens, self.tp_size, self.options.sp_threshold)
        self._counts = [0, 0]
        return self.sharded

    def end(self) -> dict:
        """Close the forward: add its counts to the totals (and the counts file)."""
        record = {
            "rank": self.rank,
            "tokens": self.num_tokens,
            "sharded": self.sharded,
            "sharded_boundaries": self._counts[0],
            "replicated_boundaries": self._counts[1],
        }
        with _lock:
            _totals["forwards"] += 1
            _totals["sharded_forwards"] += int(self.sharded)
            _totals["sharded"] += self._counts[0]
            _totals["replicated"] += self._counts[1]
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
        return record

    def _count(self) -> None:
        self._counts[0 if self.sharded else 1] += 1

    # ---- the boundaries -----------------------------------------------------------------------

    def entry(
        self,
        x: torch.Tensor,
        fn: torch.Tensor,
        scale: torch.Tensor,
        base: torch.Tensor,
        norm_weight: Optional[torch.Tensor],
    ):
        """The embedding ``x (T, H)`` into the stream and the first attention's input.
        Returns ``(residual, post, comb, layer_input (T, H))``."""
        self._count()
        return ops.fused_entry(x, fn, scale, base, norm_weight, self.group, self.sharded, self.cfg)

    def layer(
        self,
        partial: torch.Tensor,
        residual: torch.Tensor,
        post: torch.Tensor,
        comb: torch.Tensor,
        fn: torch.Tensor,
        scale: torch.Tensor,
        base: torch.Tensor,
        norm_weight: Optional[torch.Tensor],
    ):
        """A sublayer's un-reduced ``partial (T, H)`` into the stream and the next sublayer's
        input. Returns ``(residual, post, comb, layer_input (T, H))``."""
        self._count()
        return ops.fused_layer(
            partial,
            residual,
            post,
            comb,
            fn,
            scale,
            base,
            norm_weight,
            self.group,
            self.sharded,
            self.num_tokens,
            self.cfg,
        )

    def head(
        self,
        partial: torch.Tensor,
        residual: torch.Tensor,
        post: torch.Tensor,
        comb: torch.Tensor,
        fn: torch.Tensor,
        scale: torch.Tensor,
        base: torch.Tensor,
    ) -> torch.Tensor:
        """The last MoE's ``partial`` into the stream and ``hc_head``: the hidden state (T, H)."""
        self._count()
        hidden, _ = ops.fused_head(
            partial,
            residual,
            post,
            comb,
            fn,
            scale,
            base,
            self.group,
            self.sharded,
            self.num_tokens,
            self.cfg,
        )
        return hidden
