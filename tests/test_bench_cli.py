"""mhc-sp-bench: every subcommand in a quick mode writes valid JSON with the documented fields;
the cost model matches hand-computed values; bad flags are usage errors, not tracebacks."""

import json
import subprocess
import sys

import pytest

from mhc_sp.bench import cli
from mhc_sp.bench.project_cmd import Machine, boundary_time, calibrate, crossover


def run_cli(tmp_path, *argv):
    out = tmp_path / "out.json"
    assert cli.main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("mhc-sp-bench")
    assert doc["environment"]["torch"]
    return doc


def test_ops_quick(tmp_path):
    doc = run_cli(tmp_path, "ops", "--tokens", "0,3", "--hidden", "128", "--repeats", "2", "--warmup", "1",
                  "--compare", "eager", "--gemm")
    assert doc["kind"] == "ops"
    assert len(doc["rows"]) == 2 * 5
    (post_pre,) = [r for r in doc["rows"] if r["op"] == "mhc_post_pre" and r["tokens"] == 3]
    assert post_pre["x_separate"] > 0  # post then pre, timed interleaved with the fused op
    for r in doc["rows"]:
        assert {"op", "tokens", "hidden", "median_us", "p10_us", "p90_us", "GB/s", "copy_GB/s", "%copy",
                "x_gemm", "x_eager"} <= set(r)
        assert r["median_us"] > 0 and r["p10_us"] <= r["p90_us"]


def test_layer_quick(tmp_path):
    doc = run_cli(tmp_path, "layer", "--tp", "2", "--tokens", "5", "--hidden", "64", "--repeats", "2",
                  "--warmup", "1")
    (row,) = doc["rows"]
    assert row["tp"] == 2 and row["tokens"] == 5
    for k in ("fused_sharded_us", "fused_replicated_us", "separate_sharded_us"):
        assert row[k] > 0
    assert row["separate/fused"] == pytest.approx(row["separate_sharded_us"] / row["fused_sharded_us"])


def test_comm_quick(tmp_path):
    doc = run_cli(tmp_path, "comm", "--tp", "2", "--sizes", "1K,4K", "--repeats", "2", "--warmup", "1")
    assert {r["op"] for r in doc["rows"]} == {"reduce_scatter", "all_gather", "all_reduce"}
    for r in doc["rows"]:
        assert r["busbw_GB/s"] == pytest.approx(r["algbw_GB/s"] * (1.0 if r["op"] == "all_reduce" else 0.5))
        assert r["size"] == r["count"] * 2 and r["type"] == "bf16"


def test_project_matches_hand_computed_values(tmp_path):
    m = Machine(link_gbps=100, link_latency_us=1, hbm_gbps=1000, launch_us=2)
    T, H, n, tp = 1024, 4096, 4, 2
    S = 2 * T * H                                   # bf16 partial bytes
    fn = 4 * 24 * 4 * H                             # fp32 projection weights
    full = 2 * (2 * T * n * H + 2 * T * H) + fn     # one post+pre pass over all rows
    shard = 2 * (2 * 512 * n * H + 2 * 512 * H) + fn
    us = 1e-6
    assert boundary_time("replicated", T, H, n, tp, m) == pytest.approx(2 * us + S / 100e9 + full / 1000e9 + 2 * 2 * us)
    assert boundary_time("sp_fused", T, H, n, tp, m) == pytest.approx(2 * us + S / 100e9 + shard / 1000e9 + 3 * 2 * us)
    assert boundary_time("sp_separate", T, H, n, tp, m) == pytest.approx(
        2 * us + S / 100e9 + (shard + 4 * 512 * n * H) / 1000e9 + 4 * 2 * us)
    assert boundary_time("replicated", T, H, n, tp, m) == pytest.approx(175.345e-6, rel=1e-4)
    x = crossover(H, n, tp, m)
    assert x % tp == 0
    assert boundary_time("sp_fused", x, H, n, tp, m) < boundary_time("replicated", x, H, n, tp, m)
    assert boundary_time("sp_fused", x - tp, H, n, tp, m) >= boundary_time("replicated", x - tp, H, n, tp, m)
    assert crossover(H, n, 1, m) is None

    doc = run_cli(tmp_path, "project", "--tp", "2", "--tokens", "1024", "--link-gbps", "100",
                  "--link-latency-us", "1", "--hbm-gbps", "1000", "--launch-us", "2")
    assert doc["rows"][0]["replicated_us"] == pytest.approx(175.345, rel=1e-4)
    assert doc["rows"][0]["crossover_tokens"] == x


def test_project_calibration_recovers_constants(tmp_path):
    truth = Machine(link_gbps=20, link_latency_us=30, hbm_gbps=50, launch_us=15)
    rows = []
    for T in (16, 256, 1024, 4096):
        rows.append({"tp": 2, "tokens": T, "hidden": 1024,
                     "fused_sharded_us": boundary_time("sp_fused", T, 1024, 4, 2, truth) * 1e6,
                     "fused_replicated_us": boundary_time("replicated", T, 1024, 4, 2, truth) * 1e6,
                     "separate_sharded_us": boundary_time("sp_separate", T, 1024, 4, 2, truth) * 1e6})
    fit = calibrate(rows)
    for k in ("link_gbps", "link_latency_us", "hbm_gbps", "launch_us"):
        assert getattr(fit, k) == pytest.approx(getattr(truth, k), rel=1e-3)
    path = tmp_path / "layer.json"
    path.write_text(json.dumps({"rows": rows}))
    doc = run_cli(tmp_path, "project", "--tp", "2", "--calibrate", str(path))
    assert doc["machine"]["hbm_gbps"] == pytest.approx(50, rel=1e-3)


@pytest.mark.parametrize("argv", [
    ["ops", "--tokens", "abc"],
    ["ops", "--ops", "nope"],
    ["comm", "--sizes", "1Q"],
    ["layer", "--tp", "x"],
    ["project", "--hbm-gbps", "-1"],
    ["no-such-command"],
])
def test_bad_flags_are_usage_errors(argv):
    proc = subprocess.run([sys.executable, "-m", "mhc_sp.bench", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "error:" in proc.stderr


def test_model_quick(tmp_path):
    doc = run_cli(tmp_path, "model", "--tp", "2", "--tokens", "9", "--sp-threshold", "4", "--layers", "1",
                  "--hidden", "64", "--iters", "1", "--warmup", "0", "--check")
    (row,) = doc["rows"]
    assert doc["kind"] == "model"
    assert row["tp"] == 2 and row["tokens"] == 9 and row["padded_tokens"] == 10 and row["sp_engaged"] is True
    assert row["check_passed"] is True and row["max_abs_diff"] >= 0
    assert row["total_ms"] > 0 and row["phases_ms"][0]


def test_torch_profile_trace_and_plot(tmp_path):
    trace = tmp_path / "trace.json"
    run_cli(tmp_path, "ops", "--tokens", "2", "--hidden", "64", "--repeats", "2", "--compare", "none",
            "--ops", "mhc_post_pre", "--profile", "torch", "--trace", str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert "mhc_sp::mhc_post_pre" in names, "the op shows in the trace"
    assert any(n.startswith("mhc_sp/mhc_post_pre") for n in names), "so does the benchmark phase"
    pytest.importorskip("matplotlib")
    png = tmp_path / "plot.png"
    run_cli(tmp_path, "project", "--tp", "2", "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
