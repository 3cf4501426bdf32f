# SPDX-License-Identifier: Apache-2.0
"""The transport choice (mhc_sp.transports): the one table of transports, and for each device
family which transport ``init`` picks from the facts it gathered, the reason
``transport(...).reason`` reports and the error a transport requested where it cannot serve
raises, word for word; why each transport not picked was not; and that the CUDA choice gathers
peer problems (a collective) only where they matter."""

import pytest

import mhc_sp.distributed as msd
from mhc_sp import transports
from mhc_sp.transports import Group, symm
from mhc_sp.transports import choice as tc
from mhc_sp.transports.hosts import ONE_HOST

MAPS_ALL = "every rank maps every other rank's GPU memory with native atomics"


def test_init_accepts_auto_then_each_familys_transports_in_preference_order():
    assert [t.NAME for t in transports.TABLE] == ["shm", "gloo", "symm", "nccl"]
    assert transports.PREFERENCE == {"cpu": ("shm", "gloo"), "cuda": ("symm", "nccl")}
    assert msd.TRANSPORTS == {"cpu": ("auto", "shm", "gloo"), "cuda": ("auto", "symm", "nccl")}
    for t in transports.TABLE:  # what distributed.init asks of every transport
        assert callable(t.setup) and callable(t.reason), t.NAME
    # The last of each family serves every group.
    assert not hasattr(transports.gloo, "unusable") and not hasattr(transports.nccl, "unusable")


def choose_cpu(requested, name, host, why):
    group = Group(None, name, 0, len(host), "cpu", host_facts=(host, why))
    return tc.choose(transports.family("cpu"), requested, group)


def choose_cuda(requested, name, world, problems, monkeypatch):
    """The CUDA choice, with ``problems`` standing in for the peer problems gathered from every
    rank (a collective)."""
    monkeypatch.setattr(symm, "every_ranks_peer_problems", lambda group: problems())
    group = Group(None, name, 0, world, "cuda")
    return tc.choose(transports.family("cuda"), requested, group)


@pytest.mark.parametrize(
    "requested,transport,passed_over",
    [
        ("auto", "shm", {"gloo": "'shm' comes first"}),
        ("shm", "shm", {"gloo": "not requested"}),
        ("gloo", "gloo", {"shm": "not requested"}),
    ],
)
def test_cpu_ranks_on_one_host(requested, transport, passed_over):
    choice = choose_cpu(requested, "g", [0, 0, 0], ["", "", ""])
    assert choice == tc.Choice(transport, f"{requested!r} requested: {ONE_HOST}", passed_over)


def test_cpu_ranks_on_two_hosts_get_gloo_or_a_shm_error_naming_them():
    host, why = [0, 1, 0, 1], ["", "another kernel boot id", "", "another PID namespace"]
    elsewhere = (
        "ranks [1, 3] are not on rank 0's host (rank 1: another kernel boot id; rank 3: another "
        "PID namespace)"
    )
    for requested in ("auto", "gloo"):
        choice = choose_cpu(requested, "g", host, why)
        assert choice == tc.Choice(
            "gloo", f"{requested!r} requested: {elsewhere}", {"shm": elsewhere}
        )
    with pytest.raises(ValueError) as e:
        choose_cpu("shm", "g", host, why)
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


def test_cuda_every_rank_maps_every_other(monkeypatch):
    problems = Problems([{}, {}, {}])
    assert choose_cuda("auto", "g", 3, problems, monkeypatch) == tc.Choice(
        "symm", MAPS_ALL, {"nccl": "'symm' comes first"}
    )
    assert choose_cuda("symm", "g", 3, problems, monkeypatch) == tc.Choice(
        "symm", f"requested; {MAPS_ALL}", {"nccl": "not requested"}
    )
    assert problems.calls == 2
    # nccl asks nothing of the peers: no collective.
    nccl = Problems([{}, {}, {}])
    assert choose_cuda("nccl", "g", 3, nccl, monkeypatch) == tc.Choice(
        "nccl", "requested", {"symm": "not requested"}
    )
    assert nccl.calls == 0


def test_cuda_a_peer_without_native_atomics_means_nccl_for_every_rank(monkeypatch):
    problems = Problems([{}, {2: "no native atomics", 0: "PCIe"}, {}])
    why = "rank 1 cannot use rank 0's GPU memory: PCIe"  # the lowest pair is named
    got = choose_cuda("auto", "g", 3, problems, monkeypatch)
    assert got == tc.Choice("nccl", why, {"symm": why})
    with pytest.raises(ValueError) as e:
        choose_cuda("symm", "g", 3, problems, monkeypatch)
    assert str(e.value) == (
        "transport: 'symm' needs every rank of group 'g' to map every other rank's GPU memory "
        "(one host, peer access with native atomics); rank 1 cannot use rank 0's: PCIe (use "
        "'nccl' or 'auto')"
    )


def test_cuda_more_ranks_than_symm_takes(monkeypatch):
    most = symm.MAX_WORLD
    problems = Problems([{}] * (most + 1))
    why = f"symm takes at most {most} ranks"
    got = choose_cuda("auto", "g", most + 1, problems, monkeypatch)
    assert got == tc.Choice("nccl", why, {"symm": why})
    with pytest.raises(ValueError, match=rf"^transport: 'symm' takes at most {most} ranks, group "):
        choose_cuda("symm", "g", most + 1, problems, monkeypatch)
    assert problems.calls == 0


def test_a_transport_of_another_family_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="^transport: expected 'auto', 'symm' or 'nccl' for cuda"):
        choose_cuda("shm", "g", 1, Problems([{}]), monkeypatch)
    with pytest.raises(ValueError, match="^transport: expected 'auto', 'shm' or 'gloo' for cpu"):
        choose_cpu("nccl", "g", [0], [""])


def test_the_choices_are_kept_by_group_and_device_until_forgotten(monkeypatch):
    tc.record("g", "cpu", choose_cpu("auto", "g", [0, 0], ["", ""]))
    tc.record("g", "cuda", choose_cuda("nccl", "g", 2, Problems([{}, {}]), monkeypatch))
    try:
        assert tc.reason("g", "cpu") == f"'auto' requested: {ONE_HOST}"
        assert tc.reason("g", "cuda") == "requested"
        assert tc.reason("h", "cpu") is None
    finally:
        tc.forget()
    assert tc.reason("g", "cpu") is None and tc.reason("g", "cuda") is None
