# SPDX-License-Identifier: Apache-2.0
"""Every CPU kernel table gives bitwise the same results (docs/design.md §3b). The table is picked
once per process, so each table this machine has runs in a worker process of its own
(MHC_SP_CPU_KERNELS forces it) on the same hypothesis-drawn calls: every op of the KernelTable,
T 1..300, hidden sizes that are no multiple of the 8-, 16- and 32-wide steps, hc_mult 1..8, one
and two threads, and inputs holding the values whose bf16 rounding the AVX512-BF16 instruction
does not do as software does (denormal results, NaNs with a payload and a sign). A table the CPU
lacks is skipped with the reason; the outputs of the rest must equal bit for bit, except for the
sign and payload of a NaN made from several NaNs (x86 returns the first NaN operand of an
instruction, which depends on the instruction form the compiler picks): the NaNs' positions must
still match. Rounding itself is held to the software rule including NaN payloads, on calls
where each NaN has one source."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mhc_sp
from mhc_sp.testing import OPS, assert_bitwise, random_inputs

# The *_emulated tables are the AVX-512 tables' source with its zmm intrinsics emulated on AVX2
# (csrc/cpu/zmm_emulated.h; testing builds): the AVX-512 code's bits are checked on every AVX2
# machine, and on an AVX-512 machine the emulation is checked against the hardware.
TABLES = ["default", "avx2", "avx512", "avx512_bf16", "avx512_emulated", "avx512_bf16_emulated"]
WORKER_TIMEOUT_S = 120

# Runs the calls of argv[1] with the table MHC_SP_CPU_KERNELS forces; saves the outputs to argv[2].
WORKER = """
import sys, torch, mhc_sp
from mhc_sp.testing import OPS
calls = torch.load(sys.argv[1])
outputs = []
for c in calls:
    torch.set_num_threads(c["threads"])
    info = OPS[c["op"]]
    outputs.append(info.call(info.sample(c["inputs"], norm=c["norm"])))
torch.save({"table": mhc_sp.build_info()["cpu_kernels"], "outputs": outputs}, sys.argv[2])
"""

BF16_SPECIALS = [
    0x7F81,  # signalling NaN with a payload (quieted by the first multiply)
    0xFFC1,  # negative quiet NaN with a payload
    0x7F80,  # +inf
    0xFF80,  # -inf
    0x0001,  # the smallest denormal
    0x807F,  # a negative denormal
    0x0080,  # the smallest normal: times a coefficient below 1, a denormal
]


def with_specials(t: torch.Tensor, seed: int) -> torch.Tensor:
    """t (bf16) with a few of its elements set to BF16_SPECIALS."""
    g = torch.Generator().manual_seed(seed)
    flat = t.clone().view(torch.int16).flatten()
    where = torch.randint(0, flat.numel(), (len(BF16_SPECIALS),), generator=g)
    specials = torch.tensor(BF16_SPECIALS, dtype=torch.int32).to(torch.int16)
    flat[where] = specials
    return flat.view(torch.bfloat16).view(t.shape)


# (T, hc_mult, H) of the calls every batch holds, each op on each: decode sizes (T <= 4: threads
# split the hidden dim; at n = 4 and large H more than 50 000 multiply-adds, so both threads work),
# token pairs, fours and eights of the AVX-512 tiles with a remainder, several 16-token blocks;
# every hc_mult; H below one 16-value step, between the 16- and 32-value steps, one leaf (128)
# and a bit, several leaves with a partial one. A hypothesis example starts from its strategy's
# simplest draw, so with one example per run only what is fixed here is sure to be compared.
COVERED_SHAPES = [
    (1, 4, 4096),
    (2, 4, 1056),
    (3, 3, 200),
    (4, 8, 264),
    (5, 1, 33),
    (7, 2, 100),
    (13, 4, 160),
    (21, 5, 127),
    (40, 6, 48),
    (70, 7, 20),
    (300, 1, 7),
]


def one_call(op: str, T: int, n: int, H: int, seed: int, specials: bool, norm: bool, threads: int):
    """A call of op on (T, n, H): inputs from seed, with `specials` the bf16 values whose rounding
    AVX512-BF16 does not do as software does."""
    inputs = random_inputs(T, n, H, seed=seed)
    if specials:
        inputs["residual"] = with_specials(inputs["residual"], seed)
        inputs["x"] = with_specials(inputs["x"], seed + 1)
        # Tiny coefficients: products below the normal range (denormal outputs of the post).
        inputs["post"] = inputs["post"] * 2.0**-120
    return dict(op=op, inputs=inputs, norm=norm, threads=threads)


@st.composite
def calls(draw) -> dict:
    """One call of any op on drawn sizes, inputs and threads."""
    op = draw(st.sampled_from(list(OPS)))
    T = draw(st.integers(1, 300))
    n = draw(st.integers(1, 8))
    H = draw(st.one_of(st.integers(1, 80), st.sampled_from([96, 127, 160, 200, 264, 528, 1056])))
    T = max(1, min(T, 400_000 // (n * n * H + 1)))  # a few MB per call at most
    seed, specials, norm = draw(st.integers(0, 2**16)), draw(st.booleans()), draw(st.booleans())
    return one_call(op, T, n, H, seed, specials, norm, draw(st.sampled_from([1, 2])))


@st.composite
def batches(draw) -> list:
    """Every op on every COVERED_SHAPES entry, with and without the special values, a norm and a
    second thread in turn (so that the simplest example holds each), the seeds drawn; then
    calls on drawn sizes."""
    fixed = []
    for k, shape in enumerate(COVERED_SHAPES):
        for j, op in enumerate(OPS):
            seed = draw(st.integers(0, 2**16))
            i = k * len(OPS) + j
            fixed.append(one_call(op, *shape, seed, i % 2 == 0, i % 3 != 0, 1 + (i // 2) % 2))
    return fixed + draw(st.lists(calls(), min_size=12, max_size=12))


def assert_same_bits_but_nan_payloads(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Bitwise equal, except that two NaNs at the same position may differ in sign and payload."""
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), f"{name}: the NaNs are at other positions"
    assert_bitwise(name, got[~nan], want[~nan])


def run_tables(tmp_path, batch: list) -> dict:
    """table -> (name it reports, outputs of every call), or the reason it cannot run here; the
    workers run side by side."""
    path = tmp_path / "calls.pt"
    torch.save(batch, path)
    workers = {}
    for table in TABLES:
        env = {**os.environ, "MHC_SP_CPU_KERNELS": table}
        out = tmp_path / f"{table}.pt"
        p = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        workers[table] = (p, out)
    results = {}
    for table, (p, out) in workers.items():
        try:
            log, _ = p.communicate(timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise AssertionError(f"the {table} worker ran past {WORKER_TIMEOUT_S} s") from None
        if p.returncode != 0:
            refusal = f"MHC_SP_CPU_KERNELS={table}: this"
            assert refusal in log, f"the {table} worker failed:\n{log}"
            results[table] = log[log.index(refusal) :].splitlines()[0]
            continue
        saved = torch.load(out)
        results[table] = (saved["table"], saved["outputs"])
    return results


def software_bf16_bits(f: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even of fp32 bits to bf16 bits, NaNs keeping their upper half: the
    kernels' rule for values whose NaNs have a zero low half (docs/design.md §3b)."""
    u = f.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).to(torch.int32).to(torch.int16)


def rounding_call() -> tuple:
    """mhc_post with comb = 0, so that every output is one product post * x rounded to bf16 (each
    NaN has one source, so its payload is defined): x holds NaNs with payloads and both signs,
    infinities, denormals and normals; post scales some tokens into the denormal range, holds
    ties and a denormal coefficient. The call, and the bf16 bits of the software rounding."""
    T, n, H = 16, 4, 100  # 100: the 32-, 16-value steps and a scalar tail
    g = torch.Generator().manual_seed(7)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    x.view(torch.int16).view(-1)[: len(BF16_SPECIALS) * 8] = torch.tensor(
        BF16_SPECIALS * 8, dtype=torch.int32
    ).to(torch.int16)
    x = x.view(-1)[torch.randperm(T * H, generator=g)].view(T, H)
    post = torch.rand(T, n, generator=g) + 0.5
    post[::2] *= 2.0**-125  # products far below the normal range
    post[1::4] = torch.tensor([1.0 + 2.0**-9, 3.0, 2.0**-130, 1.5])  # ties, denormal coefficients
    inputs = random_inputs(T, n, H, seed=3)
    inputs.update(x=x, post=post, comb=torch.zeros(T, n, n))
    # The kernels' fp32 value: post * x, then + comb * residual (exactly +-0) stream by stream.
    out = post[:, :, None] * x.float()[:, None, :]
    for i in range(n):
        out = out + (inputs["comb"][:, i, :, None] * inputs["residual"][:, i, None, :].float())
    call = dict(op="mhc_post", inputs=inputs, norm=False, threads=2)
    return call, software_bf16_bits(out.contiguous())


@settings(
    max_examples=1,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
        HealthCheck.too_slow,
    ],
)
@given(batch=batches())
def test_every_table_gives_the_same_bits(tmp_path, batch):
    """Every table on the same calls (one worker each, side by side), and on rounding_call(). A
    table the CPU lacks must be refused by name; the test then says which tables it compared and
    why the others did not run."""
    rounding, want_bits = rounding_call()
    results = run_tables(tmp_path, [*batch, rounding])
    ran = {t: r for t, r in results.items() if isinstance(r, tuple)}
    assert "default" in ran, results["default"]
    for table, (name, outputs) in ran.items():
        assert name == f"cpu-{table.upper()}", (table, name)
        for c, got, want in zip(batch, outputs, ran["default"][1]):
            info = OPS[c["op"]]
            shape = tuple(c["inputs"]["residual"].shape)
            for out_name, a, b in zip(info.outputs, got, want):
                label = f"{table} {info.name}.{out_name} {shape} threads={c['threads']}"
                assert_same_bits_but_nan_payloads(label, a, b)
        bad = int((outputs[-1][0].view(torch.int16) != want_bits).sum())
        assert bad == 0, f"{table}: {bad} of {want_bits.numel()} bf16 roundings differ"
    refused = {t: r for t, r in results.items() if isinstance(r, str)}
    if refused:
        pytest.skip(f"compared {', '.join(ran)} bit for bit; not on this CPU: {refused}")


def test_an_unknown_table_is_refused(tmp_path):
    env = {**os.environ, "MHC_SP_CPU_KERNELS": "avx9"}
    p = subprocess.run(
        [sys.executable, "-c", "import mhc_sp"],
        env=env,
        capture_output=True,
        text=True,
        timeout=WORKER_TIMEOUT_S,
    )
    assert p.returncode != 0
    assert "MHC_SP_CPU_KERNELS=avx9 is not one of avx512_bf16, avx512, avx2, default" in p.stderr


def test_build_info_reports_the_choice():
    info = mhc_sp.build_info()
    forced = os.environ.get("MHC_SP_CPU_KERNELS")
    assert info["cpu_kernels_choice"] == (f"MHC_SP_CPU_KERNELS={forced}" if forced else "auto")
    assert info["cpu_kernels"].startswith("cpu-")


# A register only an instruction set's code names: zmm or mask registers, or the upper 16 xmm/ymm
# (AVX-512); ymm (AVX2).
AVX512_REGISTER = re.compile(r"%zmm|%k[1-7]\b|%[xy]mm(1[6-9]|2\d|3[01])\b")
AVX2_REGISTER = re.compile(r"%ymm")


def test_vector_code_only_in_its_tables():
    """The library never executes an instruction the CPU lacks: in mhc_sp._C every function that
    names an AVX-512 register belongs to an AVX-512 table (its namespace, or at::vec's instance of
    it), and every one that names a ymm register to the AVX2 or an AVX-512 table; the emulated
    tables (testing builds) are AVX2 code and name no AVX-512 register. An inline
    function that several instances share (torch's or the standard headers') keeps the copy of
    the lowest instruction set, as CMakeLists.txt links them."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("needs objdump (binutils)")
    listing = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", mhc_sp._C.__file__],
        capture_output=True,
        text=True,
        timeout=WORKER_TIMEOUT_S,
        check=True,
    ).stdout
    leaks = []
    name = ""
    for line in listing.splitlines():
        if line.endswith(">:"):
            name = line.split("<", 1)[1][:-2]
            continue
        in_avx512 = "AVX512" in name  # mhc_sp::cpu::AVX512*, at::vec::MHC_SP_AVX512*
        if "EMULATED" in name:  # the AVX-512 source built for AVX2 (tests, on any x86-64)
            in_avx512 = False
        if AVX512_REGISTER.search(line) and not in_avx512:
            leaks.append((name, line.strip()))
        elif AVX2_REGISTER.search(line) and not (in_avx512 or "AVX2" in name or "EMULATED" in name):
            leaks.append((name, line.strip()))
    assert not leaks, f"{len(leaks)} vector instructions outside their tables, e.g. {leaks[:3]}"
