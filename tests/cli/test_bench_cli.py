# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench: every subcommand in a quick mode writes valid JSON with the documented fields,
CSV with every column and plots; the cost model matches hand-computed values and its calibration
reports its fit and refuses a degenerate one; --profile torch writes a trace and says where."""

import json
import math

import pytest
import torch

from mhc_sp.bench import cli, decide, ops_cmd
from mhc_sp.bench.project_cmd import Machine, boundary_time, calibrate, crossover, path_terms
from mhc_sp.bench.timing import Timing
from mhc_sp.testing import OPS, random_inputs

#: A tiny ops run: one shape, few repeats.
#: The smallest measurement that still times something: one repeat, no warm-up, H = 64.
QUICK = ["--hidden-size", "64", "--repeats", "1", "--warmup", "0"]
TINY_OPS = ["ops", "--tokens", "2", "--hidden-size", "64", "--repeats", "2", "--warmup", "0"]


def run_cli(tmp_path, *argv):
    out = tmp_path / "out.json"
    assert cli.main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["command"] == " ".join(["mhc-sp-bench", *argv, "--json", str(out)])
    assert doc["environment"]["torch"]
    return doc


def tables(tmp_path):
    """Where a command writes its --csv and --plot, and the flags that ask for them."""
    csv_path, png = tmp_path / "out.csv", tmp_path / "out.png"
    return csv_path, png, ["--csv", str(csv_path), "--plot", str(png)]


def test_ops_quick(tmp_path):
    doc = run_cli(
        tmp_path,
        "ops",
        "--tokens",
        "0,3",
        "--hidden-size",
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


@pytest.mark.slow  # a cold torch.compile of the reference: 20-25 s on two cores
def test_ops_compiled_baseline(tmp_path):
    doc = run_cli(
        tmp_path,
        *TINY_OPS,
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
        *QUICK,
        "--compare",
        "none",
        "--ops",
        "mhc_post",
        "--budget-s",
        "1e-9",
    )
    assert [r["tokens"] for r in doc["rows"]] == [1]
    assert doc["skipped_shapes"] == [[64, 2]]


@pytest.mark.distributed
def test_comm_quick(tmp_path):
    doc = run_cli(
        tmp_path, "comm", "-tp", "2", "--sizes", "1K,4K", "--repeats", "2", "--warmup", "1"
    )
    assert {r["op"] for r in doc["rows"]} == {"reduce_scatter", "all_gather", "all_reduce"}
    for r in doc["rows"]:
        assert r["busbw_GB/s"] == pytest.approx(
            r["algbw_GB/s"] * (1.0 if r["op"] == "all_reduce" else 0.5)
        )
        assert r["size_B"] == r["count"] * 2 and r["type"] == "bf16"
        assert 0 < r["time_p10_us"] <= r["time_us"] <= r["time_p90_us"]


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
        "-tp",
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


def layer_doc(truth, tokens=(16, 256, 1024, 4096), tps=(2,), H=1024):
    """A ``layer --json`` document of times the model with constants ``truth`` predicts."""
    rows = []
    for tp in tps:
        for T in tokens:
            rows.append(
                {
                    "tensor_parallel_size": tp,
                    "tokens": T,
                    "hidden_size": H,
                    "fused_sharded_us": boundary_time("sp_fused", T, H, 4, tp, truth) * 1e6,
                    "fused_replicated_us": boundary_time("replicated", T, H, 4, tp, truth) * 1e6,
                    "separate_sharded_us": boundary_time("sp_separate", T, H, 4, tp, truth) * 1e6,
                }
            )
    return {"kind": "layer", "rows": rows}


def test_project_calibration_recovers_constants_and_reports_the_fit(tmp_path, capsys):
    truth = Machine(link_gbps=20, link_latency_us=30, hbm_gbps=50, launch_us=15)
    fit = calibrate(layer_doc(truth))
    for k in ("link_gbps", "link_latency_us", "hbm_gbps", "launch_us"):
        assert getattr(fit.machine, k) == pytest.approx(getattr(truth, k), rel=1e-3)
    assert fit.worst_error < 1e-6 and fit.points == 12
    # A tune document: sharded and replicated times of one tp size.
    rows = [
        {
            "tokens": T,
            "sharded_ms": boundary_time("sp_fused", T, 1024, 4, 2, truth) * 1e3,
            "replicated_ms": boundary_time("replicated", T, 1024, 4, 2, truth) * 1e3,
        }
        for T in (1, 16, 256, 1024, 4096)
    ]
    tune = {"kind": "tune", "tensor_parallel_size": 2, "hidden_size": 1024, "rows": rows}
    assert calibrate(tune).machine.hbm_gbps == pytest.approx(50, rel=1e-3)
    path = tmp_path / "layer.json"
    path.write_text(json.dumps(layer_doc(truth)))
    doc = run_cli(tmp_path, "project", "-tp", "2", "--calibrate", str(path))
    assert doc["machine"]["hbm_gbps"] == pytest.approx(50, rel=1e-3)
    assert doc["fit"]["points"] == 12 and doc["fit"]["worst_error"] < 1e-6
    out = capsys.readouterr().out
    assert f"assumed hardware: fitted to {path}: link 20 GB/s per direction and 30 us per " in out
    assert "fit: the model is off by 0% (median) and 0% (worst) over 12 measured times" in out


def test_project_refuses_a_degenerate_fit(tmp_path, capsys):
    # Times that grow with nothing but the bytes moved: the latency and launch terms are zero.
    flat = Machine(link_gbps=20, link_latency_us=0, hbm_gbps=50, launch_us=0)
    with pytest.raises(ValueError, match="degenerate fit: these times do not determine "):
        calibrate(layer_doc(flat))
    with pytest.raises(ValueError, match="need times at 2 or more token counts"):
        calibrate(layer_doc(flat, tokens=(16,)))
    with pytest.raises(ValueError, match="expected the --json file of tune or layer"):
        calibrate({"kind": "ops", "rows": []})
    path = tmp_path / "flat.json"
    path.write_text(json.dumps(layer_doc(flat)))
    with pytest.raises(SystemExit) as e:
        cli.main(["project", "--calibrate", str(path)])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and line.startswith(
        f"mhc-sp-bench project: error: --calibrate {path}: degenerate fit: these times do not "
        f"determine --link-latency-us, --launch-us"
    )


def test_project_names_the_hardware_with_every_constant(capsys):
    assert cli.main(["project", "-tp", "2", "--tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert (
        "assumed hardware: H200 SXM with NVLink 4: link 450 GB/s per direction and 2.5 us per "
        "ring step, memory 4800 GB/s, 4 us per kernel launch"
    ) in out
    assert cli.main(["project", "-tp", "2", "--tokens", "16", "--link-gbps", "100"]) == 0
    assert "H200 SXM with NVLink 4, changed by --link-gbps 100: link 100 GB/s" in (
        capsys.readouterr().out
    )
    assert path_terms("sp_fused", 16, 64, 4, 2)["launches"] == 3


@pytest.mark.distributed
def test_model_quick(tmp_path, capsys):
    csv_path, png, to_files = tables(tmp_path)
    argv = "model -tp 2 --tokens 3,9 --sp-threshold 4 --num-layers 1".split()
    doc = run_cli(tmp_path, *argv, *QUICK, "--check", *to_files)
    small, row = doc["rows"]
    assert doc["kind"] == "model" and small["tokens"] == 3 and small["sp_engaged"] is False
    assert (
        row["tp"] == 2
        and row["tokens"] == 9
        and row["padded_tokens"] == 10
        and row["sp_engaged"] is True
    )
    assert row["check_passed"] is True
    assert isinstance(row["max_abs_diff"], float) and math.isfinite(row["max_abs_diff"])
    out = capsys.readouterr().out
    assert f"max_abs_diff={row['max_abs_diff']:.6g}" in out
    assert row["total_ms"] > 0 and row["phases_ms"][0]
    header = csv_path.read_text().splitlines()[1].split(",")
    assert {"tokens", "sp_engaged", "total_ms", "phases_ms"} <= set(header)
    if png.exists():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ops_csv_and_plot_hold_every_column(tmp_path, capsys):
    """A later op's extra column (x_separate) used to break the CSV after the whole run."""
    csv_path, png, to_files = tables(tmp_path)
    argv = "--compare none --ops mhc_post,mhc_post_pre".split()
    doc = run_cli(tmp_path, *TINY_OPS, *argv, *to_files)
    lines = csv_path.read_text().splitlines()
    assert lines[0] == f"# {doc['command']}"
    header = lines[1].split(",")
    assert header[:3] == ["op", "tokens", "hidden_size"] and "x_separate" in header
    assert [line.split(",")[0] for line in lines[2:]] == ["mhc_post", "mhc_post_pre"]
    assert lines[2].endswith(",")  # mhc_post has no x_separate: an empty cell
    pytest.importorskip("matplotlib")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    err = capsys.readouterr().err
    assert f"wrote {tmp_path / 'out.json'}, {csv_path}, {png}" in err


def test_torch_profile_trace_and_plot(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    run_cli(
        tmp_path,
        *TINY_OPS,
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
    assert f"mhc-sp-bench: profile torch: trace written to {trace}" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    png = tmp_path / "plot.png"
    run_cli(tmp_path, "project", "-tp", "2", "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.distributed
def test_layer_quick_over_both_transports(tmp_path, capsys):
    csv_path = tmp_path / "layer.csv"
    argv = "layer -tp 2 --tokens 3,8 --hidden-size 64 --transport shm,gloo --repeats 3 --warmup 0"
    doc = run_cli(tmp_path, *argv.split(), "--csv", str(csv_path))
    rows = doc["rows"]
    assert [(r["tokens"], r["transport"]) for r in rows] == [
        (3, "shm"),
        (3, "gloo"),
        (8, "shm"),
        (8, "gloo"),
    ]
    for r in rows:
        for path in ("fused_sharded", "fused_replicated", "separate_sharded", "math_alone"):
            assert 0 < r[f"{path}_p10_us"] <= r[f"{path}_us"] <= r[f"{path}_p90_us"]
        assert r["speedup_lo_x"] <= r["speedup_x"] <= r["speedup_hi_x"]
        assert r["faster"] == decide.classify(r) and r["x_separate"] > 0
        assert r["over_math_x"] > 0  # the boundary over its floor, paired in the same rounds
    assert [r["x_gloo"] for r in rows if r["transport"] == "gloo"] == [1.0, 1.0]
    for t in ("shm", "gloo"):
        mine = [r for r in rows if r["transport"] == t]
        assert doc["sharded_beats_replicated_from_tokens"][f"tp=2 {t}"] == decide.faster_from(mine)
    assert "sharded beats replicated from: tp=2 shm: " in capsys.readouterr().out
    assert csv_path.read_text().splitlines()[1].startswith("tensor_parallel_size,tokens,")
