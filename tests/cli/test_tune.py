# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench tune: the threshold rule on intervals, verdicts generated from the table's
numbers, the interval statistics, and a tiny measured run on two ranks with every output."""

import json
import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mhc_sp.bench import cli, decide, report, tune_cmd
from mhc_sp.bench.timing import median_interval, paired_ratios, slowest_rank, spread


def rows_of(*intervals, start=1):
    """Rows at 1, 4, 16, ... tokens with (lo, median, hi) speedups."""
    return [
        {"tokens": start * 4**k, "speedup_x": m, "speedup_lo_x": lo, "speedup_hi_x": hi}
        for k, (lo, m, hi) in enumerate(intervals)
    ]


FAST, SLOW, UNSURE = (1.1, 1.2, 1.3), (0.7, 0.8, 0.9), (0.9, 1.05, 1.2)
SAME, EDGE = (0.97, 1.0, 1.03), (1.02, 1.08, 1.12)


def test_threshold_needs_the_whole_interval_above_the_margin_from_there_on():
    # Faster at 1 (noise), slower at 4, not settled at 16, faster from 64 on: 64.
    assert decide.recommend(rows_of(FAST, SLOW, UNSURE, FAST, FAST)) == 64
    assert decide.recommend(rows_of(FAST, FAST)) == 1
    # Not settled or slower at the largest count: no threshold, whatever came before.
    assert decide.recommend(rows_of(FAST, FAST, UNSURE)) is None
    assert decide.recommend(rows_of(FAST, FAST, SLOW)) is None
    # A median above 1 whose interval reaches 1.0 is not faster; nor one within the margin.
    assert decide.recommend(rows_of(FAST, (1.0, 1.5, 2.0))) is None
    assert decide.recommend(rows_of(FAST, EDGE)) is None
    assert decide.recommend(rows_of(SAME, EDGE, FAST)) == 16
    # Never at or below the CUDA graph capture size.
    rows = rows_of(FAST, SLOW, UNSURE, FAST, FAST)
    assert decide.recommend(rows, max_capture=64) == 256
    assert decide.recommend(rows_of(FAST, FAST), max_capture=4) is None
    assert decide.recommend(list(reversed(rows))) == 64
    assert [decide.classify(r) for r in rows_of(FAST, SLOW, UNSURE, SAME, EDGE)] == [
        decide.FASTER,
        decide.SLOWER,
        decide.UNSETTLED,
        decide.EQUIVALENT,
        decide.UNSETTLED,
    ]


def test_the_band_and_where_to_measure_more_finely():
    rows = rows_of(SLOW, SAME, EDGE, FAST, FAST)  # 1, 4, 16, 64, 256
    assert decide.recommend(rows) == 64
    assert [r["tokens"] for r in decide.band(rows, 64)] == [4, 16]
    assert decide.refine_between(rows) == [32]  # between the band's top (16) and 64
    rows = rows_of(SLOW, FAST, FAST)  # no band: the crossover lies between 1 and 4
    assert decide.band(rows, 4) == [] and decide.refine_between(rows) == [2]
    assert decide.refine_between(rows_of(SLOW, FAST, start=8)) == [16]  # 8, 32
    rows = rows_of(SAME, SAME, FAST, start=2)  # 2, 8, 32: 16 lies between
    assert [r["tokens"] for r in decide.band(rows, 32)] == [2, 8]
    assert decide.refine_between(rows) == [16]
    assert decide.refine_between(rows_of(FAST, FAST)) == []  # faster from the smallest count
    assert decide.refine_between(rows_of(SAME, SAME)) == []  # no threshold
    # Below the capture size nothing is measured more finely.
    assert decide.refine_between(rows_of(SAME, SAME, FAST), max_capture=4) == []


def test_verdict_lines():
    rows = rows_of(FAST, SLOW, UNSURE, FAST, (1.4, 1.5, 1.6))
    lines = decide.verdict(rows, 64, tp=2, max_capture=0)
    assert lines == [
        "SP (the stream split over 2 ranks) is faster by more than 5% from 64 tokens on: "
        "1.20x [1.10-1.30] at 64, 1.50x [1.40-1.60] at 256.",
        "Band: at 16 tokens SP and no SP are not told apart (within 5%, or intervals reaching "
        "across it); the recommendation is the count above the band. --sp-threshold 16 instead "
        "(the band's lower end) engages SP where a boundary may take up to 11% longer: "
        "1.05x [0.90-1.20] at 16.",
        "SP is slower at 4 tokens.",
        "SP is faster at 1 token too, but not by the margin at every larger count.",
        "recommended: --sp-threshold 64",
    ]
    # The threshold at the largest count is named once.
    first, below, last = decide.verdict(rows_of(SLOW, FAST), 4, 2, 0)
    assert first.endswith(
        "faster by more than 5% from 4 tokens on: 1.20x [1.10-1.30] at 4, the largest count "
        "measured."
    )
    assert first.count("1.20x") == 1 and below == "SP is slower at 1 token."
    assert last == "recommended: --sp-threshold 4"
    band = decide.verdict(rows_of(SLOW, (1.0, 1.02, 1.04), FAST), 16, 2, 0)[1]
    assert band.endswith("costs nothing measurable: SP is at worst as fast there.")
    lines = decide.verdict(rows_of(FAST, UNSURE), None, 2, 0)
    assert lines[0].startswith(
        "SP is not shown faster by more than 5% at 4 tokens, the largest count measured "
        "(speedup 1.05x [0.90-1.20])."
    )
    assert lines[-1] == "recommended: leave --sp-threshold unset (SP off)"
    lines = decide.verdict(rows_of(FAST, SLOW), None, 2, 0)
    assert lines[0].startswith("SP is slower at 4 tokens, the largest count measured")
    lines = decide.verdict(rows_of(FAST, FAST, FAST), 16, 2, max_capture=4)
    assert "Counts up to 4 run as CUDA graphs" in lines[-2]


interval = st.tuples(st.floats(0.3, 3.0), st.floats(0.0, 0.5), st.floats(0.0, 0.5)).map(
    lambda t: (round(t[0] - t[1], 2), round(t[0], 2), round(t[0] + t[2], 2))
)


@given(st.lists(interval, min_size=1, max_size=7), st.sampled_from([0, 1, 4, 16]))
def test_every_claim_of_a_verdict_matches_the_table(intervals, max_capture):
    """Each count a verdict names is classified there as in the table, each speedup it quotes
    is the table's cell for that count, and nothing is said twice."""
    rows = rows_of(*intervals)
    for r in rows:
        r["faster"] = decide.classify(r)
    threshold = decide.recommend(rows, max_capture)
    lines = decide.verdict(rows, threshold, 2, max_capture)
    table = report.format_table(rows, tune_cmd.present(doc_of(rows, threshold))[1])
    cells = {}
    for line in table.splitlines()[1:]:
        tokens, *_, speedup = re.split(r"\s{2,}", line.strip())[:4]
        cells[int(tokens)] = speedup
    for line in lines:
        for value, T in re.findall(r"(\d+\.\d\dx \[[\d.]+-[\d.]+\]) at (\d+)", line):
            assert cells[int(T)] == value.replace("x ", " ")
        quoted = re.findall(r"\d+\.\d\dx \[[^\]]+\] at \d+", line)
        assert len(quoted) == len(set(quoted)), line
    named = lambda line: [int(t) for t in re.findall(r"(\d+)(?= tokens?|,| and)", line)]  # noqa
    for line in lines:
        if line.startswith("SP is slower at ") and threshold is not None:
            for T in named(line.split(".")[0]):
                assert decide.classify(next(r for r in rows if r["tokens"] == T)) == decide.SLOWER
        if line.startswith("Band: at "):
            counts = named(line.split(" SP and no SP")[0])
            assert counts == [r["tokens"] for r in decide.band(rows, threshold, max_capture)]
            assert all(max_capture < T < threshold for T in counts)
    if threshold is None:
        assert lines[-1] == "recommended: leave --sp-threshold unset (SP off)"
    else:
        assert lines[-1] == f"recommended: --sp-threshold {threshold}"
        assert all(decide.classify(r) == decide.FASTER for r in rows if r["tokens"] >= threshold)


# ---- the rule on synthetic samples ------------------------------------------------------------

COUNTS = [1, 4, 16, 64, 256, 1024]
M = decide.MARGIN


def samples_of(ratios: dict, base: dict) -> list[dict]:
    """One rank's samples: per count, sharded times ``base`` and replicated times ``base *
    ratio`` sample by sample (the paired ratio is exactly ``ratio``)."""
    return [
        {
            "samples": {
                T: {"sharded": base[T], "replicated": [b * q for b, q in zip(base[T], ratios[T])]}
                for T in ratios
            }
        }
    ]


def uniform(seed: int, lo: float, hi: float, n: int = 24) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(lo, hi) for _ in range(n)]


def sweep(below: int, top: int, seed: int) -> tuple[dict, dict]:
    """Paired ratios per count: slower than the margin below index ``below``, anywhere within
    +-MARGIN from there to index ``top`` (the band), faster than the margin above; and base
    times spread over three decades."""
    ratios = {}
    for k, T in enumerate(COUNTS):
        lo, hi = (0.5, 1 - M - 0.01) if k < below else (1 - M, 1 + M)
        if k > top:
            lo, hi = 1 + M + 0.01, 3.0
        ratios[T] = uniform(seed + k, lo, hi)
    return ratios, {T: uniform(seed - 1 - k, 1e-5, 1e-2) for k, T in enumerate(COUNTS)}


def band_tokens(rows, threshold):
    return [r["tokens"] for r in decide.band(rows, threshold)]


@given(
    st.integers(0, len(COUNTS)),
    st.integers(-1, len(COUNTS) - 1),
    st.integers(0, 2**32),
    st.integers(0, 2**32),
)
def test_noise_within_the_band_never_moves_the_answer(below, top, seed, noise_seed):
    """Synthetic samples, slower below a band, within +-MARGIN in it, faster above: the answer is
    the count above the band; the same data gives the same answer and words; other noise within
    the band (and other base times everywhere) gives the same answer and band."""
    top = max(top, below - 1)  # top < below: an empty band
    ratios, base = sweep(below, top, seed)
    rows = tune_cmd.rows_from_samples(samples_of(ratios, base), COUNTS)
    answer = decide.recommend(rows)
    above = [T for k, T in enumerate(COUNTS) if k > top]
    assert answer == (above[0] if above else None)
    if answer is not None:
        assert band_tokens(rows, answer) == COUNTS[below : top + 1]
    assert decide.recommend(list(reversed(rows))) == answer
    again = tune_cmd.rows_from_samples(samples_of(ratios, base), COUNTS)
    assert again == rows
    assert decide.verdict(again, answer, 2, 0) == decide.verdict(rows, answer, 2, 0)
    noisy, other_base = sweep(below, top, noise_seed)
    for k, T in enumerate(COUNTS):
        if not below <= k <= top:
            noisy[T] = ratios[T]
    moved = tune_cmd.rows_from_samples(samples_of(noisy, other_base), COUNTS)
    assert decide.recommend(moved) == answer
    assert band_tokens(moved, answer) == band_tokens(rows, answer)


def doc_of(rows, threshold):
    return {
        "rows": rows,
        "hidden_size": 64,
        "hc_mult": 4,
        "tensor_parallel_size": 2,
        "environment": {"device": "cpu"},
        "transport": "shm",
        "threads_per_rank": 1,
        "repeats": 24,
        "recommended_sp_threshold": threshold,
        "max_cudagraph_capture_size": 0,
        "verdict": [],
    }


def test_interval_statistics():
    assert spread([5, 1, 4, 2, 3, 6, 7, 8, 9, 10]) == (5.5, 2, 10)
    # The binomial rule: for 24 values the 95% interval is the 7th to the 18th smallest.
    values = list(range(1, 25))
    assert median_interval(values, 0.95) == (12.5, 7, 18)
    assert median_interval([3, 1, 2], 0.95) == (2, 1, 3)  # too few: the whole range
    assert paired_ratios([2, 6], [1, 3]) == [2, 2]
    assert slowest_rank([[1, 5], [2, 4]]) == [2, 5]


@pytest.mark.distributed
def test_tiny_tune_on_two_ranks(tmp_path, capfd):
    out = {k: tmp_path / f"tune.{k}" for k in ("json", "csv", "png", "trace")}
    argv = ["tune", "-tp", "2", "--hidden-size", "64", "--tokens", "1,8", "--warmup", "0"]
    argv += ["--repeats", "6", "--max-cudagraph-capture-size", "4", "--device", "cpu"]
    argv += ["--json", str(out["json"]), "--csv", str(out["csv"]), "--plot", str(out["png"])]
    argv += ["--profile", "torch", "--trace", str(out["trace"])]
    code = cli.main(argv)
    stdout, err = capfd.readouterr()
    assert code == 0, err
    assert "allocator: " in err and "tune: rounds: 6/6" in err  # progress on stderr
    assert f"profile torch: trace written to {out['trace']}" in err
    # Rank 0's Chrome trace holds every round (tens of MB): its events' names are looked up in the
    # text, which takes milliseconds where parsing it takes seconds.
    trace = out["trace"].read_text()
    assert trace.lstrip().startswith("{") and '"traceEvents"' in trace
    for name in ("mhc_sp::fused_layer", "mhc_sp/tune T=1", "mhc_sp/tune T=8"):
        assert f'"name": "{name}"' in trace, name
    lines = stdout.strip().splitlines()
    assert lines[0] == "# mhc-sp-bench " + " ".join(argv[0:])
    assert lines[1].startswith("One layer boundary, hidden size 64, 4 streams, on 2 cpu ranks")
    header = lines[4]
    for column in ("tokens", "with SP, ms", "without SP, ms", "speedup, x", "faster"):
        assert column in header
    doc = json.loads(out["json"].read_text())
    assert doc["kind"] == "tune" and doc["tensor_parallel_size"] == 2 and doc["hidden_size"] == 64
    assert [r["tokens"] for r in doc["rows"]] == [1, 5, 8]  # the capture size + 1 is measured too
    for r in doc["rows"]:
        assert 0 < r["sharded_p10_ms"] <= r["sharded_ms"] <= r["sharded_p90_ms"]
        assert 0 < r["replicated_p10_ms"] <= r["replicated_ms"] <= r["replicated_p90_ms"]
        assert r["speedup_lo_x"] <= r["speedup_x"] <= r["speedup_hi_x"]
        assert r["faster"] == decide.classify(r)
    threshold = decide.recommend(doc["rows"], 4)
    assert doc["recommended_sp_threshold"] == threshold and (threshold is None or threshold > 4)
    assert doc["verdict"] == decide.verdict(doc["rows"], threshold, 2, 4)
    assert " ".join(lines).endswith(" ".join(doc["verdict"]))
    assert lines[-1] == doc["verdict"][-1] and all(len(line) <= 100 for line in lines[1:4])
    csv_lines = out["csv"].read_text().splitlines()
    assert csv_lines[0] == lines[0] and csv_lines[1].startswith("tokens,sharded_ms,")
    assert len(csv_lines) == 2 + 3
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # show prints the recorded run as the run printed it.
    assert cli.main(["show", str(out["json"])]) == 0
    assert capfd.readouterr().out.strip().splitlines() == lines


def test_project_recommends_a_threshold_above_the_capture_size(capsys):
    assert cli.main(["project", "-tp", "4"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2].startswith("tp=4: the model has fused SP beat replicated TP from ")
    crossover = int(out[-2].split("from ")[1].split(" tokens")[0])
    assert out[-1] == f"recommended: --sp-threshold {crossover}"
    assert cli.main(["project", "-tp", "2,4", "--max-cudagraph-capture-size", "1024"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-3] == "recommended for -tp 2: --sp-threshold 1025"
    assert out[-1] == "recommended for -tp 4: --sp-threshold 1025"
