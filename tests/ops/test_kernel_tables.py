# SPDX-License-Identifier: Apache-2.0
"""Every CPU kernel table gives bitwise the same results (docs/design.md §3b). The table is picked
once per process, so each table this machine has runs in a worker process of its own
(MHC_SP_CPU_KERNELS forces it) on the same hypothesis-drawn calls: every op of the KernelTable,
T 1..300, hidden sizes that are no multiple of the 8-, 16- and 32-wide steps, hc_mult 1..8, one
and two threads, and inputs holding the values whose bf16 rounding the AVX512-BF16 instruction
does not do as software does (denormal results, NaNs with a payload and a sign). A table the CPU
lacks is skipped with the reason; the outputs of the rest must equal bit for bit."""

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mhc_sp
from mhc_sp.testing import OPS, assert_bitwise, random_inputs

TABLES = ["default", "avx2", "avx512", "avx512_bf16"]
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


@st.composite
def calls(draw) -> dict:
    op = draw(st.sampled_from(list(OPS)))
    T = draw(st.integers(1, 300))
    n = draw(st.integers(1, 8))
    H = draw(st.one_of(st.integers(1, 80), st.sampled_from([96, 127, 160, 200, 264, 528, 1056])))
    T = max(1, min(T, 400_000 // (n * n * H + 1)))  # a few MB per call at most
    seed = draw(st.integers(0, 2**16))
    inputs = random_inputs(T, n, H, seed=seed)
    if draw(st.booleans()):
        inputs["residual"] = with_specials(inputs["residual"], seed)
        inputs["x"] = with_specials(inputs["x"], seed + 1)
        # Tiny coefficients: products below the normal range (denormal outputs of the post).
        inputs["post"] = inputs["post"] * 2.0**-120
    return dict(
        op=op,
        inputs=inputs,
        norm=draw(st.booleans()),
        threads=draw(st.sampled_from([1, 2])),
    )


def run_tables(tmp_path, batch: list, tables=TABLES) -> dict:
    """table -> (name it reports, outputs of every call), or the reason it cannot run here; the
    workers run side by side."""
    path = tmp_path / "calls.pt"
    torch.save(batch, path)
    workers = {}
    for table in tables:
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


@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(batch=st.lists(calls(), min_size=20, max_size=20))
def test_every_table_gives_the_same_bits(tmp_path, batch):
    results = run_tables(tmp_path, batch)
    ran = {t: r for t, r in results.items() if isinstance(r, tuple)}
    assert "default" in ran, results["default"]
    assert ran["default"][0] == "cpu-DEFAULT"
    for table, (name, outputs) in ran.items():
        assert name == f"cpu-{table.upper()}", (table, name)
        for c, got, want in zip(batch, outputs, ran["default"][1]):
            info = OPS[c["op"]]
            shape = tuple(c["inputs"]["residual"].shape)
            for out_name, a, b in zip(info.outputs, got, want):
                assert_bitwise(f"{table} {info.name}.{out_name} {shape}", a, b)


@pytest.mark.parametrize("table", TABLES)
def test_each_table_runs_or_is_refused_by_name(tmp_path, table):
    """A forced table runs where the CPU has it; elsewhere the worker stops with an error that
    names MHC_SP_CPU_KERNELS and what the CPU lacks, and the test says so."""
    c = dict(op="mhc_post", inputs=random_inputs(3, 4, 40, seed=1), norm=False, threads=1)
    result = run_tables(tmp_path, [c], [table])[table]
    if isinstance(result, str):
        pytest.skip(f"this machine cannot run it: {result}")
    name, outputs = result
    assert name == f"cpu-{table.upper()}"
    want = OPS["mhc_post"].call(OPS["mhc_post"].sample(c["inputs"]))
    assert_bitwise(f"{table} mhc_post", outputs[0][0], want[0])


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
