# SPDX-License-Identifier: Apache-2.0
"""The CPU ``gloo`` transport: the group's own gloo backend (a group created with backend
``"gloo"`` or ``"cpu:gloo,cuda:nccl"``), which also crosses hosts; it serves every group, and
``"auto"`` takes it where shm cannot serve. The fused boundaries run composed: the collective,
then the mHC op (csrc/transport/gloo/)."""

from __future__ import annotations

from .. import _C
from . import shm
from .group import Group

NAME = "gloo"
DEVICE = "cpu"

#: Why a CPU transport was picked: where the ranks run (the same words as shm's).
reason = shm.reason


def setup(group: Group) -> None:
    _C.init_gloo_transport(group.name)
