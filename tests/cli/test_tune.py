# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench tune: the threshold rule on intervals, verdicts generated from the table's
numbers, the interval statistics, and a tiny measured run on two ranks with every output."""

import json
import random
import re

import pytest
from hypothesis import example, given
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


def test_threshold_is_the_smallest_count_from_which_sp_is_never_slower():
    # Faster at 1, slower at 4, not settled at 16, faster from 64 on: 16, above the slower 4.
    assert decide.recommend(rows_of(FAST, SLOW, UNSURE, FAST, FAST)) == 16
    assert decide.recommend(rows_of(FAST, FAST)) == 1
    # Faster, not settled, within the margin or at its edge at the smallest count: the same 1.
    for first in (FAST, UNSURE, SAME, EDGE):
        assert decide.recommend(rows_of(first, FAST, FAST)) == 1
    # Not settled or within the margin at the largest count: SP is still never slower from 1 on.
    assert decide.recommend(rows_of(FAST, FAST, UNSURE)) == 1
    assert decide.recommend(rows_of(SAME, FAST, SAME)) == 1
    # Slower at the largest count, faster nowhere, or faster only below a slower count: none.
    assert decide.recommend(rows_of(FAST, FAST, SLOW)) is None
    assert decide.recommend(rows_of(SAME, UNSURE, EDGE)) is None
    assert decide.recommend(rows_of(FAST, SLOW, SAME)) is None
    # A median above 1 whose interval reaches 1.0 is not faster; nor one at the margin's edge.
    assert decide.recommend(rows_of(SLOW, (1.0, 1.5, 2.0))) is None
    assert decide.recommend(rows_of(SLOW, EDGE)) is None
    assert decide.recommend(rows_of(SLOW, EDGE, FAST)) == 4
    # Never at or below the CUDA graph capture size, and a slower count there does not count.
    rows = rows_of(FAST, SLOW, UNSURE, FAST, FAST)  # 1, 4, 16, 64, 256
    assert decide.recommend(rows, max_capture=64) == 256
    assert decide.recommend(rows, max_capture=4) == 16
    assert decide.recommend(rows_of(SLOW, UNSURE, FAST), max_capture=1) == 4
    assert decide.recommend(rows_of(FAST, FAST), max_capture=4) is None
    assert decide.recommend(list(reversed(rows))) == 16
    assert [decide.classify(r) for r in rows_of(FAST, SLOW, UNSURE, SAME, EDGE)] == [
        decide.FASTER,
        decide.SLOWER,
        decide.UNSETTLED,
        decide.EQUIVALENT,
        decide.UNSETTLED,
    ]
    # layer's crossover: faster at that count and every larger one.
    assert decide.faster_from(rows) == 64 and decide.faster_from(rows, max_capture=64) == 256
    assert decide.faster_from(rows_of(FAST, FAST, UNSURE)) is None


def test_both_outcomes_at_the_smallest_count_give_one_threshold():
    """The five runs that answered 1, 4, 4, 1 and 1: at 1 token (and 2, measured near the
    crossover) SP was faster by the margin in some runs and not settled in others."""
    faster_at_1 = rows_of((1.06, 1.09, 1.16), (1.25, 1.56, 2.14), FAST)
    unsettled_at_1 = rows_of((1.01, 1.08, 1.16), (1.25, 1.56, 2.14), FAST)
    unsettled_at_1_and_2 = [*unsettled_at_1, {**rows_of((0.98, 1.04, 1.12))[0], "tokens": 2}]
    answers = [decide.recommend(r) for r in (faster_at_1, unsettled_at_1, unsettled_at_1_and_2)]
    assert answers == [1, 1, 1]
    # The band, the range of thresholds that cost the same, is what noise moves instead.
    assert decide.same_cost(faster_at_1) == (1, 1)
    assert decide.same_cost(unsettled_at_1) == (1, 4)
    assert [r["tokens"] for r in decide.band(unsettled_at_1_and_2)] == [1, 2]
    assert decide.same_cost(unsettled_at_1_and_2) == (1, 4)
    # The rule before this one (faster at that count and every larger one) answered 1, 4 and 4.
    assert [decide.faster_from(r) for r in (faster_at_1, unsettled_at_1, unsettled_at_1_and_2)] == [
        1,
        4,
        4,
    ]


def test_the_band_and_where_to_measure_more_finely():
    rows = rows_of(SLOW, SAME, EDGE, FAST, FAST)  # 1, 4, 16, 64, 256
    assert decide.recommend(rows) == 4
    assert [r["tokens"] for r in decide.band(rows)] == [4, 16]
    assert decide.same_cost(rows) == (4, 64)
    assert decide.refine_between(rows) == [2]  # between the slower 1 and the threshold 4
    rows = rows_of(SLOW, FAST, FAST)  # no band: the crossover lies between 1 and 4
    assert decide.band(rows) == [] and decide.same_cost(rows) == (4, 4)
    assert decide.refine_between(rows) == [2]
    assert decide.refine_between(rows_of(SLOW, FAST, start=8)) == [16]  # 8, 32
    rows = rows_of(SLOW, SLOW, SAME, FAST, start=2)  # 2, 8, 32, 128: 16 lies between 8 and 32
    assert decide.recommend(rows) == 32 and decide.refine_between(rows) == [16]
    assert [r["tokens"] for r in decide.band(rows)] == [32] and decide.same_cost(rows) == (32, 128)
    rows = rows_of(UNSURE, FAST)  # the band touches the smallest count: nothing to refine
    assert decide.recommend(rows) == 1 and decide.refine_between(rows) == []
    assert [r["tokens"] for r in decide.band(rows)] == [1] and decide.same_cost(rows) == (1, 4)
    assert decide.band(rows_of(FAST, FAST)) == [] and decide.same_cost(rows_of(FAST, FAST)) == (
        1,
        1,
    )
    rows = rows_of(SAME, SAME)  # no threshold
    assert decide.band(rows) == [] and decide.same_cost(rows) is None
    assert decide.refine_between(rows) == []
    # At or below the capture size nothing counts as slower, nor is measured more finely.
    rows = rows_of(SLOW, SAME, FAST)
    assert decide.recommend(rows, max_capture=4) == 16 and decide.refine_between(rows, 4) == []
    assert decide.refine_between(rows_of(SLOW, SLOW, FAST), max_capture=1) == [8]


def test_verdict_lines():
    rows = rows_of(FAST, SLOW, UNSURE, FAST, (1.4, 1.5, 1.6))
    assert decide.verdict(rows, tp=2, max_capture=0) == [
        "SP (the stream split over 2 ranks) is never slower by more than 5% from 16 tokens on: "
        "1.05x [0.90-1.20] at 16, 1.50x [1.40-1.60] at 256.",
        "Band: at 16 tokens SP and no SP are not told apart (within 5%, or not settled); SP is "
        "faster by more than 5% at 64: 1.20x [1.10-1.30] at 64. Thresholds 16 to 64 cost the "
        "same; the lowest is recommended, as noise within 5% cannot move it. There SP may cost up "
        "to 11% more: 1.05x [0.90-1.20] at 16.",
        "SP is slower at 4 tokens.",
        "SP is faster at 1 token too, but slower at a larger count.",
        "recommended: --sp-threshold 16",
    ]
    # The threshold at the largest count is named once; the smallest count is said to be one.
    first, below, last = decide.verdict(rows_of(SLOW, FAST), 2, 0)
    assert first == (
        "SP (the stream split over 2 ranks) is never slower by more than 5% from 4 tokens on and "
        "faster by more than 5% there: 1.20x [1.10-1.30] at 4, the largest count measured."
    )
    assert below == "SP is slower at 1 token." and last == "recommended: --sp-threshold 4"
    first, band, last = decide.verdict(rows_of((1.0, 1.02, 1.04), FAST), 3, 0)
    assert first.startswith(
        "SP (the stream split over 3 ranks) is never slower by more than 5% from 1 token on, the "
        "smallest count measured: 1.02x [1.00-1.04] at 1"
    )
    assert band.endswith("There SP is at worst as fast.")
    assert last == "recommended: --sp-threshold 1"
    lines = decide.verdict(rows_of(SAME, SLOW, SAME, FAST), 2, 0)
    assert lines[-3:] == [
        "SP is slower at 4 tokens.",
        "At 1 token SP and no SP are not told apart, but SP is slower at a larger count.",
        "recommended: --sp-threshold 16",
    ]
    assert decide.verdict(rows_of(SAME, SLOW, SAME), 2, 0) == [
        "SP is not shown faster by more than 5% at any count above 4, where it is slower, up to "
        "16 tokens, the largest count measured (speedup 1.00x [0.97-1.03]). Leave it off, or "
        "measure larger counts with --tokens.",
        "recommended: leave --sp-threshold unset (SP off)",
    ]
    lines = decide.verdict(rows_of(FAST, UNSURE, SAME), 2, 1)
    assert lines[0].startswith(
        "SP is not shown faster by more than 5% at any count measured above 1 "
    )
    assert lines[-1] == "recommended: leave --sp-threshold unset (SP off)"
    lines = decide.verdict(rows_of(FAST, SLOW), 2, 0)
    assert lines[0].startswith("SP is slower at 4 tokens, the largest count measured")
    lines = decide.verdict(rows_of(FAST, FAST, FAST), 2, max_capture=4)
    assert lines[0].startswith(
        "SP (the stream split over 2 ranks) is never slower by more than 5% from 16 tokens on, "
        "the smallest count above the capture size 4, and faster"
    )
    assert "Counts up to 4 run as CUDA graphs" in lines[-2]
    lines = decide.verdict(rows_of(FAST), 2, max_capture=4)
    assert lines[0].startswith("No count above the CUDA graph capture size (4) was measured")


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
    lines = decide.verdict(rows, 2, max_capture)
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
    kind = {r["tokens"]: decide.classify(r) for r in rows}
    for line in lines:
        if line.startswith("SP is slower at ") and threshold is not None:
            assert all(kind[T] == decide.SLOWER for T in named(line.split(".")[0]))
        if line.startswith("Band: at "):
            counts = named(line.split(" SP and no SP")[0])
            assert counts == [r["tokens"] for r in decide.band(rows, max_capture)]
            assert counts[0] == threshold
            assert all(kind[T] in (decide.EQUIVALENT, decide.UNSETTLED) for T in counts)
            faster = int(re.search(r"faster by more than 5% at (\d+)", line)[1])
            assert kind[faster] == decide.FASTER and decide.same_cost(rows, max_capture) == (
                threshold,
                faster,
            )
    if threshold is None:
        assert lines[-1] == "recommended: leave --sp-threshold unset (SP off)"
        assert decide.band(rows, max_capture) == [] and decide.same_cost(rows, max_capture) is None
    else:
        assert lines[-1] == f"recommended: --sp-threshold {threshold}"
        assert threshold > max_capture
        assert all(kind[T] != decide.SLOWER for T in kind if T >= threshold)
        assert any(kind[T] == decide.FASTER for T in kind if T >= threshold)
        # The count just below the threshold, if above the capture size, is where SP is slower.
        below = [T for T in kind if max_capture < T < threshold]
        assert not below or kind[max(below)] == decide.SLOWER


# ---- noise inside the margin ------------------------------------------------------------------


def measured(kind: str):
    """A (lo, median, hi) speedup whose class noise within the margin cannot change, by kind:
    ``slower`` (hi at most 0.9: times 1.05 still below 0.95), ``faster`` (lo at least 1.11: times
    0.95 still above 1.05), or ``near`` (hi at least 1.0, the rest anywhere: faster, equivalent
    or not settled, and never slower, after any noise within the margin)."""
    lo, hi = {"slower": (0.3, 0.85), "near": (0.95, 1.3), "faster": (1.15, 3.0)}[kind]
    spread = st.floats(0.0, 0.3)

    def shape(t):
        m, below, above = t
        low, high = m - below, m + above
        if kind == "slower":
            high = min(high, 0.9)
        elif kind == "near":
            high = max(high, 1.0)
        else:
            low = max(low, 1.11)
        return (round(low, 3), round(min(max(m, low), high), 3), round(high, 3))

    return st.tuples(st.floats(lo, hi), spread, spread).map(shape)


@st.composite
def sweeps(draw):
    """Kinds per count (the largest count robustly faster or slower), the intervals, and one
    noise factor within the margin for each end of each interval."""
    n = draw(st.integers(1, 7))
    kinds = draw(
        st.lists(st.sampled_from(["slower", "near", "faster"]), min_size=n - 1, max_size=n - 1)
    )
    kinds.append(draw(st.sampled_from(["slower", "faster"])))
    intervals = [draw(measured(k)) for k in kinds]
    factor = st.floats(1 - decide.MARGIN, 1 + decide.MARGIN)
    noise = draw(st.lists(st.tuples(factor, factor, factor), min_size=n, max_size=n))
    return kinds, intervals, noise


@example(  # the two answers: faster by the margin at 1 token in one run, not settled in the next
    (
        ["near", "faster", "faster"],
        [(1.06, 1.09, 1.16), (1.25, 1.56, 2.14), (1.7, 1.8, 1.9)],
        [(0.955, 1.0, 1.0), (1.0, 1.0, 1.0), (1.0, 1.0, 1.0)],
    ),
    0,
    1,
)
@example(  # a band of two counts touching the smallest one, gone after the noise
    (
        ["near", "near", "faster"],
        [(1.01, 1.04, 1.1), (1.01, 1.08, 1.2), (1.2, 1.5, 1.8)],
        [(1.05, 1.0, 1.0), (1.045, 1.0, 1.0), (1.0, 1.0, 1.0)],
    ),
    0,
    1,
)
@given(sweeps(), st.sampled_from([0, 1, 4, 16]), st.sampled_from([1, 2, 4]))
def test_noise_inside_the_margin_never_moves_the_threshold(sweep, max_capture, start):
    """Any sweep, and the same sweep with every end of every interval moved by up to the margin
    either way: one threshold. Counts slower or faster by more than the margin keep their class
    under such noise; the counts near it move between faster, equivalent and not settled
    (including the smallest count, where the band then starts), which moves only the band."""
    kinds, intervals, noise = sweep
    moved = [tuple(sorted(v * f for v, f in zip(iv, fs))) for iv, fs in zip(intervals, noise)]
    rows, noisy = rows_of(*intervals, start=start), rows_of(*moved, start=start)
    for k, kind in enumerate(kinds):  # the strategy's promise
        classes = {decide.classify(rows[k]), decide.classify(noisy[k])}
        assert classes == {decide.SLOWER} if kind == "slower" else decide.SLOWER not in classes
        if kind == "faster":
            assert classes == {decide.FASTER}
    counts = [r["tokens"] for r in rows]
    slower = [T for T, kind in zip(counts, kinds) if kind == "slower" and T > max_capture]
    candidates = [T for T in counts if T > max(slower + [max_capture])]
    expected = candidates[0] if candidates and kinds[-1] == "faster" else None
    assert decide.recommend(rows, max_capture) == expected
    assert decide.recommend(noisy, max_capture) == expected
    for measurement in (rows, noisy):
        in_band = [r["tokens"] for r in decide.band(measurement, max_capture)]
        assert in_band == candidates[: len(in_band)]  # from the threshold up, if any
        if expected is not None:
            assert (in_band[:1] == [expected]) == (
                decide.classify(measurement[counts.index(expected)]) != decide.FASTER
            )


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
    """Paired ratios per count: slower than the margin below index ``below``; from there to index
    ``top`` anywhere from 1 - MARGIN to 1 + 3 MARGIN (the edge of the margin, where a count comes
    out faster, equivalent or not settled by chance); faster than the margin above; and base
    times spread over three decades."""
    ratios = {}
    for k, T in enumerate(COUNTS):
        lo, hi = (0.5, 1 - M - 0.01) if k < below else (1 - M, 1 + 3 * M)
        if k > top:
            lo, hi = 1 + M + 0.01, 3.0
        ratios[T] = uniform(seed + k, lo, hi)
    return ratios, {T: uniform(seed - 1 - k, 1e-5, 1e-2) for k, T in enumerate(COUNTS)}


def band_tokens(rows):
    return [r["tokens"] for r in decide.band(rows)]


@given(
    st.integers(0, len(COUNTS)),
    st.integers(-1, len(COUNTS) - 2),
    st.integers(0, 2**32),
    st.integers(0, 2**32),
)
def test_other_samples_of_the_same_machine_give_the_same_answer(below, top, seed, noise_seed):
    """Synthetic samples, slower below an edge, at the margin's edge in it, faster above: the
    answer is the edge's smallest count (the smallest count when nothing is slower), whichever
    of its counts come out faster; the same data gives the same answer and words; other samples
    of the same kinds everywhere (other ratios, other base times) give the same answer."""
    top = max(top, below - 1)  # top < below: no count at the edge
    ratios, base = sweep(below, top, seed)
    rows = tune_cmd.rows_from_samples(samples_of(ratios, base), COUNTS)
    answer = decide.recommend(rows)
    assert answer == (COUNTS[below] if below < len(COUNTS) else None)
    if answer is not None:
        assert band_tokens(rows) == COUNTS[below : below + len(band_tokens(rows))]
        assert len(band_tokens(rows)) <= top + 1 - below
    assert decide.recommend(list(reversed(rows))) == answer
    again = tune_cmd.rows_from_samples(samples_of(ratios, base), COUNTS)
    assert again == rows
    assert decide.verdict(again, 2, 0) == decide.verdict(rows, 2, 0)
    other, other_base = sweep(below, top, noise_seed)
    moved = tune_cmd.rows_from_samples(samples_of(other, other_base), COUNTS)
    assert decide.recommend(moved) == answer


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
    assert (
        lines[4]
        == "--sp-threshold: the smallest count from which SP is never slower by more than 5%."
    )
    header = lines[5]
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
    assert doc["band_tokens"] == [r["tokens"] for r in decide.band(doc["rows"], 4)]
    same = decide.same_cost(doc["rows"], 4)
    assert doc["same_cost_sp_thresholds"] == (None if same is None else list(same))
    assert doc["verdict"] == decide.verdict(doc["rows"], 2, 4)
    assert " ".join(lines).endswith(" ".join(doc["verdict"]))
    assert lines[-1] == doc["verdict"][-1] and all(len(line) <= 100 for line in lines[1:5])
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
