# SPDX-License-Identifier: Apache-2.0
"""The transport choice (mhc_sp._transport_choice): for each device family, which transport
``init`` picks from the facts it gathered, the reason ``transport(...).reason`` reports and the
error a transport requested where it cannot serve raises, word for word; why each transport not
picked was not; and that the CUDA choice gathers peer problems (a collective) only where they
matter."""

import pytest

import mhc_sp.distributed as msd
from mhc_sp import _transport_choice as tc

ONE_HOST = (
    "every rank is on rank 0's host (one kernel boot and PID namespace, and each rank found a "
    "shared-memory segment of every other)"
)
MAPS_ALL = "every rank maps every other rank's GPU memory with native atomics"


def test_init_accepts_auto_then_each_familys_transports_in_preference_order():
    assert tc.PREFERENCE == {"cpu": ("shm", "gloo"), "cuda": ("symm", "nccl")}
    assert msd.TRANSPORTS == {"cpu": ("auto", "shm", "gloo"), "cuda": ("auto", "symm", "nccl")}


@pytest.mark.parametrize(
    "requested,transport,passed_over",
    [
        ("auto", "shm", {"gloo": "'shm' comes first"}),
        ("shm", "shm", {"gloo": "not requested"}),
        ("gloo", "gloo", {"shm": "not requested"}),
    ],
)
def test_cpu_ranks_on_one_host(requested, transport, passed_over):
    choice = tc.choose_cpu(requested, "g", [0, 0, 0], ["", "", ""])
    assert choice == tc.Choice(transport, f"{requested!r} requested: {ONE_HOST}", passed_over)


def test_cpu_ranks_on_two_hosts_get_gloo_or_a_shm_error_naming_them():
    host, why = [0, 1, 0, 1], ["", "another kernel boot id", "", "another PID namespace"]
    elsewhere = (
        "ranks [1, 3] are not on rank 0's host (rank 1: another kernel boot id; rank 3: another "
        "PID namespace)"
    )
    for requested in ("auto", "gloo"):
        choice = tc.choose_cpu(requested, "g", host, why)
        assert choice == tc.Choice(
            "gloo", f"{requested!r} requested: {elsewhere}", {"shm": elsewhere}
        )
    with pytest.raises(ValueError) as e:
        tc.choose_cpu("shm", "g", host, why)
    assert str(e.value) == (
        "transport: 'shm' needs every rank of group 'g' on one host; ranks [1, 3] do not share "
        "rank 0's host (use 'gloo' or 'auto'): rank 1: another kernel boot id; rank 3: another "
        "PID namespace"
    )


class Problems:
    """A peer_problems() that counts its calls (each is a collective in init)."""

    def __init__(self, problems):
        self.problems, self.calls = problems, 0

    def __call__(self):
        self.calls += 1
        return self.problems


def test_cuda_every_rank_maps_every_other():
    problems = Problems([{}, {}, {}])
    assert tc.choose_cuda("auto", "g", 3, 8, problems) == tc.Choice(
        "symm", MAPS_ALL, {"nccl": "'symm' comes first"}
    )
    assert tc.choose_cuda("symm", "g", 3, 8, problems) == tc.Choice(
        "symm", f"requested; {MAPS_ALL}", {"nccl": "not requested"}
    )
    assert problems.calls == 2
    # nccl asks nothing of the peers: no collective.
    nccl = Problems([{}, {}, {}])
    assert tc.choose_cuda("nccl", "g", 3, 8, nccl) == tc.Choice(
        "nccl", "requested", {"symm": "not requested"}
    )
    assert nccl.calls == 0


def test_cuda_a_peer_without_native_atomics_means_nccl_for_every_rank():
    problems = Problems([{}, {2: "no native atomics", 0: "PCIe"}, {}])
    why = "rank 1 cannot use rank 0's GPU memory: PCIe"  # the lowest pair is named
    assert tc.choose_cuda("auto", "g", 3, 8, problems) == tc.Choice("nccl", why, {"symm": why})
    with pytest.raises(ValueError) as e:
        tc.choose_cuda("symm", "g", 3, 8, problems)
    assert str(e.value) == (
        "transport: 'symm' needs every rank of group 'g' to map every other rank's GPU memory "
        "(one host, peer access with native atomics); rank 1 cannot use rank 0's: PCIe (use "
        "'nccl' or 'auto')"
    )


def test_cuda_more_ranks_than_symm_takes():
    problems = Problems([{}] * 9)
    why = "symm takes at most 8 ranks"
    assert tc.choose_cuda("auto", "g", 9, 8, problems) == tc.Choice("nccl", why, {"symm": why})
    with pytest.raises(ValueError, match=r"^transport: 'symm' takes at most 8 ranks, group 'g' "):
        tc.choose_cuda("symm", "g", 9, 8, problems)
    assert problems.calls == 0


def test_a_transport_of_another_family_is_refused():
    with pytest.raises(ValueError, match="^transport: expected 'auto', 'symm' or 'nccl' for cuda"):
        tc.choose_cuda("shm", "g", 1, 8, Problems([{}]))
    with pytest.raises(ValueError, match="^transport: expected 'auto', 'shm' or 'gloo' for cpu"):
        tc.choose_cpu("nccl", "g", [0], [""])


def test_the_choices_are_kept_by_group_and_device_until_forgotten():
    tc.record("g", "cpu", tc.choose_cpu("auto", "g", [0, 0], ["", ""]))
    tc.record("g", "cuda", tc.choose_cuda("nccl", "g", 2, 8, Problems([{}, {}])))
    try:
        assert tc.reason("g", "cpu") == f"'auto' requested: {ONE_HOST}"
        assert tc.reason("g", "cuda") == "requested"
        assert tc.reason("h", "cpu") is None
    finally:
        tc.forget()
    assert tc.reason("g", "cpu") is None and tc.reason("g", "cuda") is None
