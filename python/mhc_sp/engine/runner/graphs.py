# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs: each planned graph size of a forward (or draft step) is captured on first use and
replayed afterwards. Plans only pick graphs for sizes that never shard (``runner.plan``)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..model import IntermediateTensors, ModelOutput


class CapturedCall:
    """``fn(*inputs)`` captured as a CUDA graph over static copies of ``inputs``."""

    def __init__(self, fn, inputs: list[Tensor], device: torch.device):
        self.inputs = [t.clone() for t in inputs]
        # Warm up on a side stream (allocator pools, lazy init), then capture.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            fn(*self.inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn(*self.inputs)

    def replay(self, inputs: list[Tensor]) -> ModelOutput:
        """Copy ``inputs`` into the static buffers, replay, and return copies of the outputs
        (the originals live in the graph's pool and the next replay overwrites them)."""
        for dst, src in zip(self.inputs, inputs):
            dst.copy_(src)
        self.graph.replay()
        out = self.out

        def clone(t):
            return t.clone() if t is not None else None

        inter = out.intermediate
        return ModelOutput(
            logits=clone(out.logits),
            intermediate=IntermediateTensors(inter.stream.clone()) if inter is not None else None,
            final_stream=clone(out.final_stream),
        )


class GraphCache:
    """The captured calls of one runner, by key (what runs, and its graph size)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.calls: dict[tuple, CapturedCall] = {}

    def run(self, key: tuple, fn, inputs: list[Tensor]) -> ModelOutput:
        """Replay the graph of ``fn`` for ``key``, capturing it on first use."""
        if key not in self.calls:
            self.calls[key] = CapturedCall(fn, inputs, self.device)
        return self.calls[key].replay(inputs)
