# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench: every subcommand in a quick mode writes valid JSON with the documented fields;
the cost model matches hand-computed values; bad flags are usage errors, not tracebacks."""

import json
import math
import subprocess
import sys

import pytest
import torch

from mhc_sp.bench import cli, ops_cmd
from mhc_sp.bench.project_cmd import Machine, boundary_time, calibrate, crossover
from mhc_sp.bench.timing import Timing
from mhc_sp.testing import OPS, random_inputs


def run_cli(tmp_path, *argv):
    out = tmp_path / "out.json"
    assert cli.main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["command"] == " ".join(["mhc-sp-bench", *argv, "--json", str(out)])
    assert doc["environment"]["torch"]
    return doc


def test_ops_quick(tmp_path):
    doc = run_cli(
        tmp_path,
        "ops",
        "--tokens",
        "0,3",
        "--hidden",
        "128",
        "--repeats",
        "2",
        "--warmup",
        "1",
        "--compare",
        "eager",
        "--gemm",
    )
    assert doc["kind"] == "ops"
    shapes = [(T, name) for T in (0, 3) for name in OPS]
    assert [(r["tokens"], r["op"]) for r in doc["rows"]] == shapes
    for r in doc["rows"]:
        # bytes: the registry's model for this shape; GB/s: those bytes over the median time
        sample = OPS[r["op"]].sample(random_inputs(r["tokens"], 4, 128))
        assert r["bytes"] == OPS[r["op"]].bytes_moved(sample)
        assert r["GB/s"] == pytest.approx(r["bytes"] / (r["median_us"] * 1e-6) / 1e9)
        assert 0 < r["p10_us"] <= r["median_us"] <= r["p90_us"]
        assert {"x_gemm", "x_eager"} <= set(r) and "x_compile" not in r
        assert ("x_separate" in r) == (r["op"] == "mhc_post_pre")  # post then pre, interleaved


def test_ops_row_ratios_say_how_much_faster_the_op_is():
    t = {
        "op": Timing(2e-6, 1e-6, 3e-6, 5),
        "copy": Timing(1e-6, 1e-6, 1e-6, 5),
        "separate": Timing(3e-6, 3e-6, 3e-6, 5),
        "eager": Timing(20e-6, 20e-6, 20e-6, 5),
        "gemm": Timing(4e-6, 4e-6, 4e-6, 5),
    }
    r = ops_cmd.row("mhc_post_pre", 3, 128, 4000, t, torch.device("cpu"))
    assert (r["median_us"], r["p10_us"], r["p90_us"]) == pytest.approx((2, 1, 3))
    assert r["GB/s"] == pytest.approx(2.0) and r["copy_GB/s"] == pytest.approx(4.0)
    assert r["%copy"] == pytest.approx(50)
    assert r["x_separate"] == pytest.approx(1.5) and r["x_eager"] == pytest.approx(10)
    assert r["x_gemm"] == pytest.approx(0.5)  # the op takes half a GEMM's time
    assert "graph" not in r
    graphed = {**t, "op": Timing(2e-6, 1e-6, 3e-6, 5, graph=True)}
    cuda = ops_cmd.row("mhc_post", 3, 128, 4000, graphed, torch.device("cuda"))
    assert cuda["graph"] is True and cuda["eager_graph"] is False


def test_ops_compiled_baseline(tmp_path):
    doc = run_cli(
        tmp_path,
        "ops",
        "--tokens",
        "2",
        "--hidden",
        "64",
        "--repeats",
        "2",
        "--warmup",
        "1",
        "--compare",
        "compile",
        "--ops",
        "hc_head",
    )
    (r,) = doc["rows"]
    assert "compile_error" not in r
    assert r["x_compile"] > 0 and math.isfinite(r["x_compile"])


def test_ops_budget_leaves_out_later_shapes(tmp_path):
    doc = run_cli(
        tmp_path,
        "ops",
        "--tokens",
        "1,2",
        "--hidden",
        "64",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--compare",
        "none",
        "--ops",
        "mhc_post",
        "--budget-s",
        "1e-9",
    )
    assert [r["tokens"] for r in doc["rows"]] == [1]
    assert doc["skipped_shapes"] == [[64, 2]]


def test_comm_quick(tmp_path):
    doc = run_cli(
        tmp_path, "comm", "--tp", "2", "--sizes", "1K,4K", "--repeats", "2", "--warmup", "1"
    )
    assert {r["op"] for r in doc["rows"]} == {"reduce_scatter", "all_gather", "all_reduce"}
    for r in doc["rows"]:
        assert r["busbw_GB/s"] == pytest.approx(
            r["algbw_GB/s"] * (1.0 if r["op"] == "all_reduce" else 0.5)
        )
        assert r["size"] == r["count"] * 2 and r["type"] == "bf16"


def test_project_matches_hand_computed_values(tmp_path):
    m = Machine(link_gbps=100, link_latency_us=1, hbm_gbps=1000, launch_us=2)
    T, H, n, tp = 1024, 4096, 4, 2
    S = 2 * T * H  # bf16 partial bytes
    fn = 4 * 24 * 4 * H  # fp32 projection weights
    full = 2 * (2 * T * n * H + 2 * T * H) + fn  # one post+pre pass over all rows
    shard = 2 * (2 * 512 * n * H + 2 * 512 * H) + fn
    us = 1e-6
    assert boundary_time("replicated", T, H, n, tp, m) == pytest.approx(
        2 * us + S / 100e9 + full / 1000e9 + 2 * 2 * us
    )
    assert boundary_time("sp_fused", T, H, n, tp, m) == pytest.approx(
        2 * us + S / 100e9 + shard / 1000e9 + 3 * 2 * us
    )
    assert boundary_time("sp_separate", T, H, n, tp, m) == pytest.approx(
        2 * us + S / 100e9 + (shard + 4 * 512 * n * H) / 1000e9 + 4 * 2 * us
    )
    assert boundary_time("replicated", T, H, n, tp, m) == pytest.approx(175.345e-6, rel=1e-4)
    x = crossover(H, n, tp, m)
    assert x % tp == 0
    assert boundary_time("sp_fused", x, H, n, tp, m) < boundary_time("replicated", x, H, n, tp, m)
    assert boundary_time("sp_fused", x - tp, H, n, tp, m) >= boundary_time(
        "replicated", x - tp, H, n, tp, m
    )
    assert crossover(H, n, 1, m) is None

    doc = run_cli(
        tmp_path,
        "project",
        "--tp",
        "2",
        "--tokens",
        "1024",
        "--link-gbps",
        "100",
        "--link-latency-us",
        "1",
        "--hbm-gbps",
        "1000",
        "--launch-us",
        "2",
    )
    assert doc["rows"][0]["replicated_us"] == pytest.approx(175.345, rel=1e-4)
    assert doc["rows"][0]["crossover_tokens"] == x


def test_project_calibration_recovers_constants(tmp_path):
    truth = Machine(link_gbps=20, link_latency_us=30, hbm_gbps=50, launch_us=15)
    rows = []
    for T in (16, 256, 1024, 4096):
        rows.append(
            {
                "tp": 2,
                "tokens": T,
                "hidden": 1024,
                "fused_sharded_us": boundary_time("sp_fused", T, 1024, 4, 2, truth) * 1e6,
                "fused_replicated_us": boundary_time("replicated", T, 1024, 4, 2, truth) * 1e6,
                "separate_sharded_us": boundary_time("sp_separate", T, 1024, 4, 2, truth) * 1e6,
            }
        )
    fit = calibrate(rows)
    for k in ("link_gbps", "link_latency_us", "hbm_gbps", "launch_us"):
        assert getattr(fit, k) == pytest.approx(getattr(truth, k), rel=1e-3)
    path = tmp_path / "layer.json"
    path.write_text(json.dumps({"rows": rows}))
    doc = run_cli(tmp_path, "project", "--tp", "2", "--calibrate", str(path))
    assert doc["machine"]["hbm_gbps"] == pytest.approx(50, rel=1e-3)


@pytest.mark.parametrize(
    "argv",
    [
        ["ops", "--tokens", "abc"],
        ["ops", "--ops", "nope"],
        ["ops", "--hc-mult", "9"],
        ["comm", "--sizes", "1Q"],
        ["layer", "--tp", "x"],
        ["project", "--hbm-gbps", "-1"],
        ["no-such-command"],
    ],
)
def test_bad_flags_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_usage_error_from_the_command_line():
    """The installed entry point exits 2 with argparse's message, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "mhc_sp.bench", "ops", "--ops", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "error: --ops: unknown op(s) ['nope']" in proc.stderr


def test_model_quick(tmp_path, capsys):
    doc = run_cli(
        tmp_path,
        "model",
        "-tp",
        "2",
        "--tokens",
        "9",
        "--sp-threshold",
        "4",
        "--num-layers",
        "1",
        "--hidden-size",
        "64",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--check",
    )
    (row,) = doc["rows"]
    assert doc["kind"] == "model"
    assert (
        row["tp"] == 2
        and row["tokens"] == 9
        and row["padded_tokens"] == 10
        and row["sp_engaged"] is True
    )
    assert row["check_passed"] is True
    assert isinstance(row["max_abs_diff"], float) and math.isfinite(row["max_abs_diff"])
    assert f"max_abs_diff={row['max_abs_diff']:.6g}" in capsys.readouterr().out
    assert row["total_ms"] > 0 and row["phases_ms"][0]


def test_torch_profile_trace_and_plot(tmp_path):
    trace = tmp_path / "trace.json"
    run_cli(
        tmp_path,
        "ops",
        "--tokens",
        "2",
        "--hidden",
        "64",
        "--repeats",
        "2",
        "--compare",
        "none",
        "--ops",
        "mhc_post_pre",
        "--profile",
        "torch",
        "--trace",
        str(trace),
    )
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert "mhc_sp::mhc_post_pre" in names, "the op shows in the trace"
    assert any(n.startswith("mhc_sp/mhc_post_pre") for n in names), "so does the benchmark phase"
    pytest.importorskip("matplotlib")
    png = tmp_path / "plot.png"
    run_cli(tmp_path, "project", "--tp", "2", "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
