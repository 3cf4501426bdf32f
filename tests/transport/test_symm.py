# SPDX-License-Identifier: Apache-2.0
"""Host-side logic of the CUDA symm transport, on CPU: the layout of a rank's buffer, which mailbox
or half a call uses, which path a call takes, the peer pointer table's checks, the error text,
and the peer problems the transport choice reads (mhc_sp.transports.symm; the choice itself is
test_transport_choice.py's). The kernels themselves run in bench/symm_harness.py on a GPU
(simulated ranks)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mhc_sp.distributed as msd
from mhc_sp import _C, transports
from mhc_sp import reference as R
from mhc_sp.testing import TESTING_MODULE_MISSING, load_testing_module
from mhc_sp.transports import Group
from mhc_sp.transports import choice as _transport_choice
from mhc_sp.transports import symm as _symm

_testing = load_testing_module()
# The host arithmetic of the symm transport is bound in the testing module only.
needs_testing = pytest.mark.skipif(_testing is None, reason=TESTING_MODULE_MISSING)

C = _C.symm_constants()
PAGE = 4096
ALIGN = 128


def layout(world, slot=C["default_mailbox_slot_bytes"], half=C["default_half_bytes"]):
    return _C.symm_buffer_layout(world, slot, half)


@pytest.mark.parametrize("world", [1, 2, 3, 8, 16])
def test_buffer_regions_are_page_aligned_ordered_and_disjoint(world):
    L = layout(world, slot=1000, half=5000)
    assert L["flags_offset"] == PAGE  # page 0: the protocol's SegmentHeader
    assert L["mailbox_slot_bytes"] == 1024  # rounded up to 128
    assert L["half_bytes"] == 8192  # rounded up to a page
    regions = [
        (L["flags_offset"], C["max_blocks"] * world * 8),
        (L["mailbox_offset"], C["mailboxes"] * world * L["mailbox_slot_bytes"]),
        (L["halves_offset"], 2 * L["half_bytes"]),
    ]
    end = PAGE
    for start, size in regions:
        assert start % PAGE == 0 and start >= end
        end = start + size
    assert L["total_bytes"] == end


@needs_testing
def test_default_sizes_hold_a_v4_pro_prefill_and_decode():
    # A half holds a sharded boundary of 8192 tokens at H = 7168 for every world the NVLink
    # domain of one host has; a mailbox slot holds 16 tokens of H = 7168.
    for world in (2, 4, 8):
        need = _testing.symm_exchange_layout("fused_layer", True, 8192, 8192, 7168, 2, world)[
            "need"
        ]
        assert need <= C["default_half_bytes"]
    assert 16 * 7168 * 2 + 16 <= C["default_mailbox_slot_bytes"]  # rows and the call's tag
    assert (
        _testing.symm_path(
            "fused_layer",
            False,
            16,
            16,
            8192,
            8,
            C["default_mailbox_slot_bytes"],
            C["default_half_bytes"],
        )
        == "lamport"
    )


@needs_testing
def test_flag_words_are_distinct_per_block_and_source():
    world = 4
    seen = {
        _testing.symm_flag_offset(world, b, s)
        for b in (0, 1, 2, C["max_blocks"] - 1)
        for s in range(world)
    }
    assert len(seen) == 4 * world
    assert all(o % 8 == 0 for o in seen)
    L = layout(world)
    assert max(seen) + 8 <= L["mailbox_offset"]


@needs_testing
def test_mailbox_and_half_indices_cycle():
    assert [_testing.symm_mailbox_index(c) for c in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [_testing.symm_half_index(c) for c in range(5)] == [0, 1, 0, 1, 0]
    big = 2**64 - 1  # the device counters are 64-bit and never wrap in practice; still consistent
    assert _testing.symm_mailbox_index(big) == big % 3
    assert _testing.symm_half_index(big) == 1


@settings(max_examples=60, deadline=None)
@given(
    world=st.integers(1, 16),
    num_tokens=st.integers(0, 5000),
    hidden=st.sampled_from([8, 64, 4096, 7168]),
)
@needs_testing
def test_sharded_layer_exchange_layout(world, num_tokens, hidden):
    X = _testing.symm_exchange_layout("fused_layer", True, num_tokens, num_tokens, hidden, 2, world)
    shard = -(-num_tokens // world)
    row = hidden * 2
    assert X["in_rows"] == X["out_rows"] == shard
    assert X["row_bytes"] == row
    assert X["landing_offset"] >= world * ALIGN  # every source's CallHeader first
    assert X["landing_stride"] % ALIGN == 0
    assert X["out_offset"] == X["landing_offset"] + world * X["landing_stride"]
    assert X["out_offset"] + X["landing_stride"] <= C["default_half_bytes"]
    assert X["need"] % ALIGN == 0
    # need is the smallest half whose slots hold the shard: it fits exactly when a slot does.
    assert (X["need"] <= C["default_half_bytes"]) == (shard * row <= X["landing_stride"])


@settings(max_examples=40, deadline=None)
@given(
    world=st.integers(1, 16),
    calls=st.lists(
        st.tuples(
            st.sampled_from(["reduce_scatter", "all_reduce", "all_gather", "fused_layer"]),
            st.integers(0, 5000),
        ),
        min_size=2,
        max_size=4,
    ),
    half=st.sampled_from([1 << 20, C["default_half_bytes"], 5 * 4096 + 1]),
)
@needs_testing
def test_exchange_slots_do_not_depend_on_the_call(world, calls, half):
    # Ranks that disagree about a call (another op or token count: a mismatch the first barrier
    # reports) push before they know it; with slots fixed by the half and the world, source p
    # still writes only slot p of a peer's half and an owner only its own out slot, so no two
    # ranks write the same bytes (what ThreadSanitizer found when the stride followed the call).
    layouts = [
        _testing.symm_exchange_layout(op, op == "fused_layer", n, n, 64, 2, world, half)
        for op, n in calls
    ]
    slots = {(X["landing_offset"], X["landing_stride"], X["out_offset"]) for X in layouts}
    assert len(slots) == 1
    for X in layouts:
        fits = X["need"] <= -(-half // PAGE) * PAGE
        assert fits == (max(X["in_rows"], X["out_rows"]) * X["row_bytes"] <= X["landing_stride"])


@pytest.mark.parametrize(
    "op,sharded,in_rows,out_rows",
    [
        ("reduce_scatter", False, 3, 0),  # ceil(10 / 4) rows land from every source
        ("all_reduce", False, 3, 3),  # ... and the reduced shard is published for the gather
        ("all_gather", False, 0, 10),  # the rank's own rows are published
        ("fused_entry", True, 0, 3),  # the shard of layer_input only
        ("fused_head", True, 3, 3),
        ("fused_layer", False, 0, 0),  # replicated: the Lamport mailbox, no half
        ("fused_entry", False, 0, 0),
    ],
)
@needs_testing
def test_exchange_layout_per_op(op, sharded, in_rows, out_rows):
    X = _testing.symm_exchange_layout(op, sharded, 10, 10, 64, 2, 4)
    assert (X["in_rows"], X["out_rows"]) == (in_rows, out_rows)


@needs_testing
def test_paths():
    slot, half = C["default_mailbox_slot_bytes"], C["default_half_bytes"]

    def path(op, sharded, rows, inner, world=8):
        return _testing.symm_path(op, sharded, rows, rows, inner, world, slot, half)

    for T in (1, 7, 16):
        assert path("fused_layer", False, T, 7168) == "lamport"
    assert (
        path("fused_layer", False, 17, 7168) == "exchange"
    )  # the op composes all_reduce + post_pre
    assert path("fused_layer", False, 16, 4100) == "fallback"  # H % 8: NCCL
    assert path("all_reduce", False, 17, 7168) == "lamport"  # plain all_reduce: bytes decide
    assert path("all_reduce", False, 19, 7168) == "exchange"
    assert path("all_reduce", False, 1, 64) == "lamport"
    assert path("all_reduce", False, 4, 65536) == "exchange"  # 512 KiB: past a slot
    assert path("fused_layer", True, 8192, 7168) == "exchange"
    assert path("fused_layer", True, 8192, 7168, world=1) == "fallback"  # 2 x 117 MB > 192 MiB
    assert path("fused_layer", True, 100, 4100) == "fallback"
    assert path("all_gather", False, 100, 4) == "fallback"  # 8-byte rows: not 16-byte vectors
    # A slot holds the rows and, in its last 16 bytes, the call's tag.
    assert _testing.symm_path("all_reduce", False, 1, 1, 64, 2, 128 + 128, half) == "lamport"
    assert _testing.symm_path("all_reduce", False, 1, 1, 128, 2, 256, half) == "exchange"


@needs_testing
def test_layout_argument_errors():
    with pytest.raises(ValueError, match="^world: "):
        _C.symm_buffer_layout(0, 1024, 8192)
    with pytest.raises(ValueError, match="^world: "):
        _C.symm_buffer_layout(C["max_world"] + 1, 1024, 8192)
    with pytest.raises(ValueError, match="^mailbox_slot_bytes: "):
        _C.symm_buffer_layout(2, 8, 8192)
    with pytest.raises(ValueError, match="^half_bytes: "):
        _C.symm_buffer_layout(2, 1024, 100)
    with pytest.raises(ValueError, match="^op: "):
        _testing.symm_exchange_layout("broadcast", False, 1, 1, 8, 2, 2)
    with pytest.raises(ValueError, match="^rows: "):
        _testing.symm_exchange_layout("all_gather", False, -1, 1, 8, 2, 2)
    with pytest.raises(ValueError, match="^block: "):
        _testing.symm_flag_offset(2, C["max_blocks"], 0)


@needs_testing
def test_peer_table_checks():
    ptrs = [0x10000, 0x20000, 0x30000]
    assert _testing.symm_checked_peer_table(ptrs, 1, 3, 0x20000) == ptrs
    cases = [
        (ptrs[:2], 1, 3, 0x20000, "^peer_ptrs: expected 3 pointers"),
        ([0x10000, 0, 0x30000], 1, 3, 0, "^peer_ptrs: rank 1's buffer is not mapped"),
        ([0x10000, 0x20008, 0x30000], 1, 3, 0x20008, "^peer_ptrs: rank 1's buffer .* not 16-byte"),
        (
            [0x10000, 0x10000, 0x30000],
            0,
            3,
            0x10000,
            "^peer_ptrs: rank 1's buffer is mapped at the same",
        ),
        (ptrs, 2, 3, 0x20000, "^peer_ptrs: entry 2 \\(this rank\\)"),
        (ptrs, 3, 3, 0x20000, "^rank: "),
        (ptrs, 0, 0, 0x10000, "^world: "),
    ]
    for p, rank, world, local, match in cases:
        with pytest.raises(ValueError, match=match):
            _testing.symm_checked_peer_table(p, rank, world, local)


@needs_testing
def test_refused_call_text():
    text = _testing.symm_describe_error("peer_broken", 1, 0, 0, 3, 9, 0.0, "tp", 2.0)
    assert "the start of a call" in text and "refused the call (its outputs are NaN)" in text
    assert "rank 0 had marked the workspace broken" in text


@needs_testing
def test_error_text_names_the_peer():
    text = _testing.symm_describe_error("timeout", 3, 5, 17, 1, 42, 2.5, "tp", 2.0)
    assert "rank 3" in text and "waiting for rank 5" in text and "block 17" in text
    assert "first barrier" in text and "epoch 42" in text and "group 'tp'" in text
    assert "broken" in text
    assert "rank 6 had marked" in _testing.symm_describe_error(
        "peer_broken", 0, 6, 0, 0, 1, 0.0, "g", 1.0
    )
    assert "Lamport mailbox" in _testing.symm_describe_error(
        "peer_broken", 0, 6, 0, 0, 1, 0.0, "g", 1.0
    )
    assert "rank 2 made a different call" in _testing.symm_describe_error(
        "mismatch", 0, 2, 0, 1, 1, 0, "g", 1
    )


def test_peer_problems():
    hosts = ["a", "a", "a", "b"]
    devices = [0, 1, 1, 0]
    allowed = {(0, 1), (1, 0)}

    def link(a, b):
        return None if (a, b) in allowed else f"no link {a}->{b}"

    assert _symm.peer_problems(0, hosts, devices, link) == {3: "it runs on another host"}
    got = _symm.peer_problems(1, hosts, devices, link)  # rank 2 shares its GPU
    assert sorted(got) == [2, 3] and got[2].startswith("it shares GPU 1 (set ")
    assert _symm.SHARED_GPU_SWITCH in got[2]
    # Ranks on one GPU are reachable when torch's switch for it is set (two-process tests).
    assert _symm.peer_problems(1, hosts, devices, link, shared_gpus=True) == {
        3: "it runs on another host"
    }
    assert _symm.peer_problems(0, hosts[:3], [0, 1, 2], lambda a, b: "PCIe") == {
        1: "PCIe",
        2: "PCIe",
    }
    with pytest.raises(ValueError, match="^hosts: "):
        _symm.peer_problems(0, hosts[:2], devices, link)
    with pytest.raises(ValueError, match="^rank: "):
        _symm.peer_problems(4, hosts, devices, link)


def test_cuda_link_problem_needs_access_and_native_atomics(monkeypatch):
    links = {
        (0, 1): {"access": True, "native_atomics": True},
        (0, 2): {"access": True, "native_atomics": False},
        (0, 3): {"access": False, "native_atomics": False},
    }
    monkeypatch.setattr(_symm._C, "cuda_peer_link", lambda a, b: links[(a, b)], raising=False)
    assert _symm.cuda_link_problem(0, 1) is None
    assert "without native atomics" in _symm.cuda_link_problem(0, 2)
    assert _symm.cuda_link_problem(0, 3) == "GPU 0 has no peer access to GPU 3"


def test_peer_table_is_segment_base_plus_each_ranks_offset():
    # torch symmetric memory may sub-allocate: buffer_ptrs are segment bases, and each rank's
    # buffer sits at its own offset in its segment (exchanged over the group).
    bases = [0x7F0000000000, 0x7E0000000000, 0x7D0000000000]
    offsets = [0x200000, 0x200000, 0x400000]
    assert _symm.peer_table(bases, offsets) == [b + o for b, o in zip(bases, offsets)]
    with pytest.raises(ValueError, match="^offsets: "):
        _symm.peer_table(bases, offsets[:2])
    assert _symm.buffer_offset(0x1200, 0x1000, 0x100, 0x400) == 0x200
    assert _symm.buffer_offset(0x1000, 0x1000, 0x100, None) == 0
    with pytest.raises(ValueError, match="^buffer: .* is not inside its rendezvous segment"):
        _symm.buffer_offset(0x0F00, 0x1000, 0x100, 0x400)
    with pytest.raises(ValueError, match="^buffer: "):
        _symm.buffer_offset(0x1380, 0x1000, 0x100, 0x400)  # runs past the segment's end


@needs_testing
def test_lamport_tags_never_hold_the_empty_marker_and_tell_calls_apart():
    seen = set()
    for op in ("fused_layer", "all_reduce"):
        for rows, inner in ((1, 7168), (16, 7168), (131072, 1), (2**30 - 1, 2**30 - 1)):
            for call in (0, 1, 2, 3, 2**15, 2**29 + 7):
                for blocks, chunks in ((1, 1), (132, 1), (1024, 1), (132, 32)):
                    tag = _testing.symm_lamport_tag(op, rows, inner, call, blocks, chunks)
                    assert len(tag) == 8 and all(0 <= lane < 0x8000 for lane in tag), tag
                    seen.add(tuple(tag))
    # Every call, and every launch plan of it (a rank with another grid or split), tells apart.
    assert len(seen) == 2 * 4 * 6 * 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_init_without_cuda_raises():
    # A build without CUDA cannot make NCCL's communicator; a CUDA build without a GPU says so.
    with pytest.raises(
        ValueError, match="^device: (mhc_sp was built without CUDA|CUDA transports)"
    ):
        _symm.check_build()


def test_byte_arguments_are_checked():
    assert _symm._check_bytes(None, "half_bytes", 7, 1) == 7
    with pytest.raises(TypeError, match="^half_bytes: "):
        _symm._check_bytes(1.5, "half_bytes", 7, 1)
    with pytest.raises(ValueError, match="^half_bytes: "):
        _symm._check_bytes(100, "half_bytes", 7, 4096)


@pytest.mark.cuda  # reads the CUDA build
@pytest.mark.skipif(not hasattr(_testing, "SymmSimGroup"), reason="mhc_sp built without CUDA")
@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU path runs in bench/symm_harness.py")
def test_cuda_build_exposes_the_harness_without_a_gpu():
    # The CUDA build links the transport; creating a group needs a GPU and says so.
    with pytest.raises(ValueError, match=r"^device: expected a device index in \[0, 0\), got 0"):
        _testing.SymmSimGroup(2, 0, 4096, 8192, 1.0)


def test_harness_script_runs_to_its_no_gpu_exit():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "symm_harness.py"
    spec = importlib.util.spec_from_file_location("symm_harness", path)
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    assert harness.parse_args(["--quick", "--budget-s", "5"]).quick
    if not torch.cuda.is_available():
        assert harness.main(["--quick"]) == 2


def test_reference_sum_starts_from_plus_zero():
    # The rule of every transport (and of the mailbox, whose empty marker is -0): fp32 rank-order
    # sum from +0, one rounding. -0 everywhere gives +0; 1 + 2^-8 + 2^-9 rounds once, not twice.
    parts = [
        torch.tensor([-0.0, 1.0, 2.0**-9, -0.0]).bfloat16(),
        torch.tensor([-0.0, 2.0**-8, 2.0**-9, 0.0]).bfloat16(),
    ]
    total = R.sum_partials(parts)
    want = torch.tensor([0.0, 1.0 + 2.0**-8, 2.0**-8, 0.0]).bfloat16()
    assert total.view(torch.int16).tolist() == want.view(torch.int16).tolist()
    assert R.sum_partials([torch.tensor([-0.0], dtype=torch.float64)]).item() == 0.0
    assert not torch.signbit(R.sum_partials([torch.tensor([-0.0], dtype=torch.float64)])).item()


def test_symm_is_a_cuda_transport_only():
    assert msd.TRANSPORTS["cuda"] == ("auto", "symm", "nccl")
    with pytest.raises(ValueError, match=r"^transport: 'symm' does not serve cpu tensors"):
        msd.init(device="cpu", transport="symm")
    with pytest.raises(ValueError, match=r"^transport: expected one of 'auto', 'symm', 'nccl'"):
        msd.init(device="cuda", transport="ncl")


def peer_gpus(world):
    """True when `world` GPUs can each map every other's memory (what symm needs)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < world:
        return False
    return all(
        torch.cuda.can_device_access_peer(a, b)
        for a in range(world)
        for b in range(world)
        if a != b
    )


@pytest.mark.cuda  # one GPU per rank
@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 4])
def test_fused_ops_on_symm_match_reference(world):
    # The production path (torch symmetric memory, one rank per GPU): every case of boundary_cases,
    # the sums bit for bit reference.sum_partials. Needs `world` GPUs with peer access.
    if not peer_gpus(world):
        pytest.skip(f"{world} GPUs with peer access needed")
    from mhc_sp.local_world import run_world
    from tests.helpers.boundaries import boundary_cases, worker_fused_ops

    results = run_world(
        world, worker_fused_ops, "cuda", "symm", backend="cpu:gloo,cuda:nccl", timeout=300
    )
    assert [checked for checked, _ in results] == [len(boundary_cases(world))] * world
    assert [d for _, d in results] == [results[0][1]] * world


class FakeWorld:
    """Stands in for torch.distributed, torch symmetric memory and the CUDA bindings, so that
    the symm setup's orchestration runs on CPU as rank 0 of a world of two: what the peer
    contributes to each gather is given; the arguments init hands to the C++ side are recorded."""

    def __init__(self, devices, peer_offset=(0x40000, None), own_offset=0x10000):
        # peer_offset: what rank 1 reports, (offset in its segment, None) or (None, its error)
        self.devices, self.peer_offset, self.own_offset = devices, peer_offset, own_offset
        self.gathers, self.init_args = 0, None

    def all_gather_object(self, out, value, group=None):
        self.gathers += 1
        peer = {1: self.devices[1], 2: {}, 3: self.peer_offset}[self.gathers]
        out[:] = [value, peer]

    def broadcast_object_list(self, objs, group=None, group_src=0):
        pass

    def barrier(self, group=None):
        pass

    def empty(self, nbytes, dtype, device):
        self.buffer = torch.empty(nbytes, dtype=dtype)
        return self.buffer

    def rendezvous(self, buffer, name):
        base = buffer.data_ptr() - self.own_offset
        self.handle = type(
            "Handle", (), {"buffer_ptrs": [base, 0x7F0000000000], "buffer_size": 1 << 40}
        )
        return self.handle

    def install(self, monkeypatch):
        import torch.distributed as dist

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        for name in ("all_gather_object", "broadcast_object_list", "barrier"):
            monkeypatch.setattr(_symm.dist, name, getattr(self, name))
        monkeypatch.setattr(dist, "_symmetric_memory", self, raising=False)
        monkeypatch.setattr(_C, "nccl_unique_id", lambda: b"id", raising=False)
        monkeypatch.setattr(
            _C,
            "cuda_peer_link",
            lambda a, b: {"access": True, "native_atomics": True},
            raising=False,
        )

        def init_symm_transport(*args):
            self.init_args = args

        monkeypatch.setattr(_C, "init_symm_transport", init_symm_transport, raising=False)
        monkeypatch.setattr(_C, "init_nccl_communicator", lambda *args: None, raising=False)


def set_up_symm(host):
    """Rank 0's ``init(device="cuda:0", transport="symm", timeout=5)`` in a world of two whose
    hosts are ``host``; returns the transport set up."""
    group = Group(None, "g", 0, 2, "cuda", "cuda:0", 5.0, host_facts=(host, ["", ""]))
    return transports.set_up(group, "symm")


def test_init_builds_the_table_from_every_ranks_offset(monkeypatch):
    world = FakeWorld(devices=[0, 1])
    world.install(monkeypatch)
    assert set_up_symm([0, 0]) == "symm"
    name, uid, index, buffer, ptrs = world.init_args[:5]
    assert (name, uid, index) == ("g", b"id", 0)  # separate GPUs: an NCCL fallback too
    assert ptrs == [world.buffer.data_ptr(), 0x7F0000000000 + 0x40000]
    # The workspace gets the rendezvous handle: it keeps the peers' buffers mapped.
    assert world.init_args[-1] is world.handle
    assert "native atomics" in _transport_choice.reason("g", "cuda")
    _transport_choice.forget()
    assert _transport_choice.reason("g", "cuda") is None


def test_init_on_ranks_of_two_hosts_picks_nccl(monkeypatch):
    world = FakeWorld(devices=[0, 1])
    world.install(monkeypatch)
    with pytest.raises(ValueError, match="^transport: 'symm' needs .* it runs on another host"):
        set_up_symm([0, 1])


def test_init_with_ranks_on_one_gpu_keeps_no_nccl(monkeypatch):
    world = FakeWorld(devices=[0, 0])
    world.install(monkeypatch)
    with pytest.raises(ValueError, match="^transport: 'symm' needs .* shares GPU 0"):
        set_up_symm([0, 0])
    world = FakeWorld(devices=[0, 0])
    world.install(monkeypatch)
    monkeypatch.setenv(_symm.SHARED_GPU_SWITCH, "1")
    assert set_up_symm([0, 0]) == "symm"
    assert world.init_args[1] is None  # NCCL refuses ranks on one GPU
    _transport_choice.forget()


def test_init_fails_on_every_rank_when_one_buffer_is_outside_its_segment(monkeypatch):
    world = FakeWorld(devices=[0, 1], peer_offset=(None, "buffer: not inside (peer)"))
    world.install(monkeypatch)
    with pytest.raises(ValueError, match=r"^buffer: not inside \(peer\) \(rank 1 of group 'g'\)"):
        set_up_symm([0, 0])
    assert world.init_args is None


def test_transport_names_compare_as_strings_and_carry_a_reason():
    t = msd.Transport("nccl")
    t.reason = "rank 0 cannot use rank 1's GPU memory: PCIe"
    assert t == "nccl" and isinstance(t, str) and t.reason.endswith("PCIe")
    assert msd.Transport("shm").reason is None
