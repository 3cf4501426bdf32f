# SPDX-License-Identifier: Apache-2.0
"""``mhc-sp-bench tune`` (and the cost model's answer in ``project``): the threshold rule, the
verdict, a tiny measured run on two gloo ranks, the README's default job."""

import json

import pytest

from mhc_sp.bench import cli
from mhc_sp.bench.tune_cmd import QUICK, recommend, verdict


def rows_of(*pairs, start=1):
    """Rows at 1, 4, 16, ... tokens with (with SP, without SP) times in ms."""
    return [
        {"tokens": start * 4**k, "sharded_ms": s, "replicated_ms": r, "speedup": r / s}
        for k, (s, r) in enumerate(pairs)
    ]


def test_threshold_is_where_sp_stays_faster():
    # SP wins at 1 token (noise), loses at 4 and 16, wins from 64 on: 64.
    rows = rows_of((1, 2), (3, 2), (5, 4), (7, 8), (20, 30))
    assert recommend(rows) == 64
    # Winning at every size: the smallest one.
    assert recommend(rows_of((1, 2), (2, 3))) == 1
    # Losing at the largest size: no threshold, whatever happened before.
    assert recommend(rows_of((1, 2), (2, 3), (5, 4))) is None
    # Equal is not faster.
    assert recommend(rows_of((1, 2), (3, 3))) is None
    # Never at or below the CUDA graph capture size, even where SP wins there.
    assert recommend(rows, max_capture=64) == 256
    assert recommend(rows, max_capture=16) == 64
    assert recommend(rows_of((1, 2), (2, 3)), max_capture=4) is None
    # Unsorted input is fine.
    assert recommend(list(reversed(rows))) == 64


def test_verdict_ends_with_the_recommended_flag():
    rows = rows_of((1, 2), (3, 2), (5, 4), (7, 8), (20, 30))
    lines = verdict(rows, 64, tp=2, max_capture=0)
    assert lines[-1] == "recommended: --sp-threshold 64"
    assert lines[0].startswith(
        "Verdict: with SP (the stream split over 2 ranks) a boundary is "
        "faster from 64 tokens on: 1.14x at 64 tokens, 1.50x at 256."
    )
    assert "slower at 2 of the 3 sizes measured" in lines[1]
    lines = verdict(rows_of((1, 2), (2, 3)), 1, tp=2, max_capture=0)
    assert "faster from 1 token on: 2.00x at 1 token, 1.50x at 4." in lines[0]
    lines = verdict(rows_of((3, 2), (5, 4)), None, tp=2, max_capture=0)
    assert lines[-1] == "recommended: leave --sp-threshold unset (SP off)"
    assert lines[0].startswith(
        "Verdict: with SP a boundary was not faster at 4 tokens, the largest count measured"
    )


def test_tiny_tune_on_two_ranks(tmp_path, capfd):
    path = tmp_path / "tune.json"
    code = cli.main(
        [
            "tune",
            "-tp",
            "2",
            "--hidden-size",
            "64",
            "--tokens",
            "1,8",
            "--warmup",
            "0",
            "--repeats",
            "2",
            "--max-cudagraph-capture-size",
            "4",
            "--device",
            "cpu",
            "--calibrate",
            "--json",
            str(path),
        ]
    )
    out, err = capfd.readouterr()
    assert code == 0, err
    # Progress while measuring, on stderr; the capture size + 1 is measured too.
    assert "tune: measured 1 tokens (1/3)" in err and "tune: measured 8 tokens (3/3)" in err
    lines = out.strip().splitlines()
    assert lines[0].startswith("# mhc-sp-bench")
    header = next(line for line in lines if line.lstrip().startswith("tokens"))
    for column in ("with SP (ms)", "without SP (ms)", "SP speedup (x)", "faster"):
        assert column in header
    assert lines[-1].startswith("recommended: ")
    assert any(line.startswith("cost model fitted to these times") for line in lines)
    doc = json.loads(path.read_text())
    assert doc["kind"] == "tune" and doc["tensor_parallel_size"] == 2 and doc["hidden_size"] == 64
    assert [r["tokens"] for r in doc["rows"]] == [1, 5, 8]
    assert all(r["sharded_ms"] > 0 and r["replicated_ms"] > 0 for r in doc["rows"])
    # The recommendation follows the rule on the measured rows and respects the capture size.
    expected = recommend(doc["rows"], 4)
    assert doc["recommended_sp_threshold"] == expected
    assert lines[-1] == (
        "recommended: leave --sp-threshold unset (SP off)"
        if expected is None
        else f"recommended: --sp-threshold {expected}"
    )
    assert expected is None or expected > 4
    assert doc["transport"] in ("gloo", "shm") and doc["verdict"][-1] == lines[-1]


def test_default_job_is_a_quick_tune():
    quick = cli.parse_args([])
    assert quick.command == "tune" and quick.func.__module__ == "mhc_sp.bench.tune_cmd"
    assert quick.tensor_parallel_size == 2 and quick.hidden_size == 4096
    assert quick.tokens == [4, 16, 64, 256, 1024] and quick.repeats == 8
    assert quick.argv == ["tune", *QUICK]  # the JSON records the command that reproduces the run
    assert cli.parse_args(["tune", *QUICK]) == quick


@pytest.mark.parametrize(
    "argv,message",
    [
        (["-tp", "1"], "--tensor-parallel-size: SP needs at least 2 ranks, got 1"),
        (["--repeats", "0"], "--warmup must be >= 0 and --repeats >= 1"),
        (["--sp-threshold", "8"], "unrecognized arguments: --sp-threshold 8"),
        (["-tp", "0"], "argument --tensor-parallel-size/-tp: expected a positive integer, got '0'"),
        (["--transport", "carrier-pigeon", "--device", "cpu"], "--transport: "),
    ],
)
def test_tune_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_project_recommends_a_threshold_above_the_capture_size(capsys):
    assert cli.main(["project", "--tp", "4"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2].startswith(
        "tp=4 (450 GB/s links, 4800 GB/s memory): the model has fused SP beat replicated TP from "
    )
    crossover = int(out[-2].split("from ")[1].split(" tokens")[0])
    assert out[-1] == f"recommended: --sp-threshold {crossover}"
    assert cli.main(["project", "--tp", "2,4", "--max-cudagraph-capture-size", "1024"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-3] == "recommended for -tp 2: --sp-threshold 1025"
    assert out[-1] == "recommended for -tp 4: --sp-threshold 1025"
