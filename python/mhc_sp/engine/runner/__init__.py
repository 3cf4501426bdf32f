# SPDX-License-Identifier: Apache-2.0
"""The model runner (docs/design.md §3), one module per concern:

* ``plan``: :func:`plan_forward` and :func:`is_sharded`, the one place that decides padding, the
  SP decision and the CUDA graph of a forward or an MTP draft step (pure functions);
* ``pipeline``: TP / PP groups and the hand-off between pipeline stages;
* ``graphs``: CUDA graph capture and replay;
* ``drafter``: MTP draft steps, each a forward of its own;
* ``calls``: token id checks, padding and timings every call shares;
* ``model_runner``: :class:`ModelRunner`, which only wires them;
* ``tolerance``: :func:`logits_tolerance`, how far two TP sizes may differ.
"""

from .calls import PAD_TOKEN_ID
from .drafter import DraftOutput
from .model_runner import ModelRunner, RunnerOutput
from .pipeline import ParallelGroups, init_parallel_groups
from .plan import ForwardPlan, is_sharded, plan_forward
from .tolerance import logits_tolerance

__all__ = [
    "DraftOutput",
    "ForwardPlan",
    "ModelRunner",
    "PAD_TOKEN_ID",
    "ParallelGroups",
    "RunnerOutput",
    "init_parallel_groups",
    "is_sharded",
    "logits_tolerance",
    "plan_forward",
]
