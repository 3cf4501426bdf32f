# SPDX-License-Identifier: Apache-2.0
"""``mhc-sp-bench model``: spawned gloo ranks and torchrun, MTP draft steps with their own SP
decisions, --check of every step against tp=1, configuration and usage errors."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mhc_sp.bench import cli

PYTHON_DIR = str(Path(__file__).resolve().parents[2] / "python")


def bench(*argv, torchrun=0, timeout=180):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    launcher = (
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={torchrun}",
        ]
        if torchrun
        else [sys.executable]
    )
    cmd = launcher + ["-m", "mhc_sp.bench", "model", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def max_abs_diff(stdout):
    values = re.findall(r"^max_abs_diff=(\S+)$", stdout, re.M)
    assert len(values) == 1, stdout
    return float(values[0])


@pytest.mark.distributed
def test_tp2_pp2_under_torchrun_with_two_draft_steps_and_check():
    r = bench(
        "-tp",
        "2",
        "-pp",
        "2",
        "--tokens",
        "9",
        "--sp-threshold",
        "4",
        "--num-layers",
        "2",
        "--num-speculative-tokens",
        "2",
        "--requests",
        "2",
        "--check",
        "--repeats",
        "1",
        torchrun=4,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(re.findall(r"^tokens=9 padded=10", r.stdout, re.M)) == 1  # one rank reports
    assert "SP engaged: yes (token-sharded: 5 stream rows per rank)" in r.stdout
    # Each draft step plans its own forward: all 9 rows (sharded), then one row per request.
    assert "MTP draft step 0: tokens=9 padded=10 SP engaged: yes" in r.stdout
    assert "MTP draft step 1: tokens=2 padded=2 SP engaged: no\n" in r.stdout
    assert re.search(
        r"stage 0: embed [\d.]+  boundary [\d.]+  attention [\d.]+  moe [\d.]+  "
        r"pp_send [\d.]+",
        r.stdout,
    )
    assert re.search(
        r"stage 1: pp_recv [\d.]+  boundary [\d.]+  attention [\d.]+  moe [\d.]+  "
        r"lm_head [\d.]+  mtp [\d.]+",
        r.stdout,
    )
    assert 0 < max_abs_diff(r.stdout) < 0.1 and "check: PASS" in r.stdout
    for name in ("logits", "draft step 0", "draft step 1"):
        assert re.search(rf"^  {name}: max_abs_diff [\d.e-]+ \(tolerance", r.stdout, re.M), name


def test_check_exits_nonzero_above_tolerance(monkeypatch, capsys):
    # One rank runs in this process, so a patched tolerance applies: tp=1 against tp=1 is
    # bit-exact (max_abs_diff=0), and a negative tolerance must make the check fail.
    import mhc_sp.engine.runner

    monkeypatch.setattr(mhc_sp.engine.runner, "logits_tolerance", lambda layers, ref: -1.0)
    code = cli.main(
        [
            "model",
            "--tokens",
            "5",
            "--num-layers",
            "1",
            "--hidden-size",
            "64",
            "--num-speculative-tokens",
            "2",
            "--check",
            "--repeats",
            "1",
            "--warmup",
            "0",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    assert "check: FAIL" in out and max_abs_diff(out) == 0.0
    assert "  draft step 1: max_abs_diff 0 (tolerance -1)" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["-tp", "2", "--sp-threshold", "8", "--max-cudagraph-capture-size", "8"],
            "sp_threshold=8 must be greater than max_cudagraph_capture_size=8",
        ),
        (
            ["-tp", "2", "--sp-threshold", "16", "--moe-backend", "capacity"],
            "moe_backend='capacity' does not support sequence parallelism",
        ),
        (["-tp", "5"], "model.num_heads=12 must be divisible by tensor_parallel_size=5"),
        (
            ["-pp", "3", "--num-layers", "2"],
            "model.num_layers=2 must be >= pipeline_parallel_size=3",
        ),
        (["--tokens", "4", "--requests", "5"], "--requests 5 must be <= --tokens 4"),
    ],
)
def test_config_errors_exit_2_with_the_message(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["model", *argv])
    captured = capsys.readouterr()
    assert e.value.code == 2
    assert captured.err.startswith("mhc-sp-bench model: error: ") and message in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_enforce_eager_runs_any_threshold():
    # --enforce-eager captures nothing, so a threshold at or below the capture size is accepted.
    from mhc_sp.bench.model_cmd import build_engine

    argv = ["model", "-tp", "2", "--sp-threshold", "8", "--max-cudagraph-capture-size", "16"]
    engine = build_engine(cli.parse_args([*argv, "--enforce-eager"]))
    assert engine.sp_threshold == 8 and engine.compilation.max_cudagraph_capture_size == 0
    with pytest.raises(ValueError, match="sp_threshold=8 must be greater than"):
        build_engine(cli.parse_args(argv))


def test_more_ranks_than_torchrun_started_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(SystemExit) as e:
        cli.main(["model", "-tp", "2"])
    assert e.value.code == 2
    assert (
        "error: tensor_parallel_size=2 x pipeline_parallel_size=1 needs 2 ranks, but the world "
        "has 1"
    ) in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--sp-threshold", "0"],
            "argument --sp-threshold: expected a positive integer at most 2147483647",
        ),
        (
            ["--sp-threshold", str(2**40)],
            "argument --sp-threshold: expected a positive integer at most 2147483647 (2**31 - 1, "
            f"the most tokens a forward can have) or None, got '{2**40}'",
        ),
        (
            ["--sp-threshold", "lots"],
            "argument --sp-threshold: expected a positive integer or None, got 'lots'",
        ),
        (
            ["-tp", "two"],
            "argument --tensor-parallel-size/-tp: expected a positive integer, got 'two'",
        ),
        (["--tokens", "0"], "argument --tokens: expected comma-separated integers >= 1, got '0'"),
    ],
)
def test_impossible_flag_values_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["model", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err


def test_discovered_subcommands():
    names = [m.__name__ for m in cli.subcommand_modules()]
    assert {"mhc_sp.bench.model_cmd", "mhc_sp.bench.tune_cmd"} <= set(names)
    assert all(n.endswith("_cmd") for n in names) and names == sorted(names)
    text = cli.build_parser().format_help()
    assert "model" in text and "tune" in text


def draft_line(step, tokens, tp):
    """The report line of a draft step with ``sp_threshold`` 2: sharded iff the step's own count
    is at least the threshold and at least tp (the engine's draft layer), padded only then."""
    if tokens >= 2 and tokens >= tp:
        padded = -(-tokens // tp) * tp
        return f"MTP draft step {step}: tokens={tokens} padded={padded} SP engaged: yes"
    return f"MTP draft step {step}: tokens={tokens} padded={tokens} SP engaged: no"


CHECK_MATRIX = [(tp, pp, spec) for tp in (2, 3, 4) for pp in (1, 2) for spec in (0, 2)]


@pytest.mark.distributed
@pytest.mark.slow  # 16-65 s each on two shared cores; the default suite has the torchrun run above
@pytest.mark.parametrize("tp,pp,spec", CHECK_MATRIX)
def test_check_passes_for_every_engine(tp, pp, spec):
    # 8 tokens in 3 requests at sp_threshold 2: the forward and draft step 0 shard; draft step 1
    # (3 tokens) shards at tp 2 and 3 but not at tp 4, where it has fewer tokens than ranks.
    argv = ["-tp", str(tp), "-pp", str(pp), "--tokens", "8", "--requests", "3"]
    argv += ["--sp-threshold", "2", "--num-speculative-tokens", str(spec)]
    r = bench(*argv, "--check", "--repeats", "1", "--warmup", "0", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "check: PASS" in r.stdout and max_abs_diff(r.stdout) < 0.1
    padded = -(-8 // tp) * tp
    assert f"tokens=8 padded={padded} " in r.stdout and "SP engaged: yes" in r.stdout
    if spec:
        assert draft_line(0, 8, tp) in r.stdout and draft_line(1, 3, tp) in r.stdout, r.stdout
