# SPDX-License-Identifier: Apache-2.0
"""Teardown of the transports: mhc_sp.distributed.destroy() releases every registered transport
(the registry lets go of each, and each frees what it holds: the shm workspace its mapping of the
shared segment, an NCCL communicator its ncclComm), and the same destroy() runs from an atexit
hook when a process ends without calling it. Checked here with the CPU transports (shm and gloo)
on two ranks; the NCCL teardown, which goes through the same registry path, has its tests in
tests/cuda/test_nccl.py (they need two GPUs)."""

import textwrap

import torch

from mhc_sp import ops
from mhc_sp.local_world import run_world
from tests.helpers.reporting_ranks import run_reporting_ranks

SEGMENT = "/dev/shm/mhc_sp_"  # the shm workspaces' segments (new_shm_segment_name)


def mapped_segments() -> int:
    """How many mappings of shm-workspace segments this process holds."""
    with open("/proc/self/maps") as f:
        return sum(SEGMENT in line for line in f)


def set_up_both(world):
    """WORLD on shm and a second group on gloo, each checked with one all_reduce."""
    import torch.distributed as dist

    import mhc_sp.distributed as msd

    shm = msd.init(device="cpu", transport="shm")
    gloo = msd.init(dist.new_group(list(range(world)), backend="gloo"), "cpu", transport="gloo")
    for group, name in ((shm, "shm"), (gloo, "gloo")):
        assert msd.transport(group, "cpu") == name
        got = ops.all_reduce(torch.ones(3, 4), group)
        assert torch.equal(got, torch.full((3, 4), float(world))), name
    return shm, gloo


def worker_destroy(rank, world):
    import pytest

    import mhc_sp.distributed as msd

    shm, gloo = set_up_both(world)
    assert mapped_segments() >= 1
    msd.destroy()
    assert mapped_segments() == 0, "destroy() left the shm workspace mapped"
    for group in (shm, gloo):
        with pytest.raises(ValueError, match="is not initialised with mhc_sp"):
            msd.transport(group, "cpu")
    msd.destroy()  # nothing left: a no-op
    shm, gloo = set_up_both(world)  # and init works again after it
    msd.destroy()
    return mapped_segments()


def test_destroy_releases_every_transport():
    assert run_world(2, worker_destroy, start="forkserver") == [0, 0]


# A rank that ends without destroy(): its check is registered before mhc_sp is imported, so that
# it runs after mhc_sp's exit hook (atexit runs hooks in reverse order).
EXITING_RANK = textwrap.dedent(
    """
    import atexit, json
    import torch
    import torch.distributed as dist

    state = {}

    def report():
        from mhc_sp import _C
        from tests.transport.test_teardown import mapped_segments
        try:
            _C.group_transport(state["shm"], "cpu")
            state["registered_at_exit"] = True
        except ValueError:
            state["registered_at_exit"] = False
        state["mapped_at_exit"] = mapped_segments()
        print("REPORT " + json.dumps(state), flush=True)

    atexit.register(report)
    import mhc_sp  # registers mhc_sp.distributed's exit hook
    from tests.transport.test_teardown import mapped_segments, set_up_both

    dist.init_process_group("gloo")
    state["shm"], state["gloo"] = set_up_both(dist.get_world_size())
    state["mapped_before_exit"] = mapped_segments()
    """
)


def test_exit_hook_releases_every_transport():
    reports = run_reporting_ranks(EXITING_RANK, OMP_NUM_THREADS="1")
    for r in reports:
        assert r["mapped_before_exit"] >= 1
        assert r["registered_at_exit"] is False, "the exit hook did not run destroy()"
        assert r["mapped_at_exit"] == 0, "the shm workspace outlived the exit hook"
