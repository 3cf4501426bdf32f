"""``mhc-sp-bench model``: spawned gloo ranks, torchrun, --check, config errors."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mhc_sp.bench import cli

PYTHON_DIR = str(Path(__file__).resolve().parents[1] / "python")


def bench(*argv, torchrun=0, timeout=180):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc-per-node={torchrun}"] if torchrun else [sys.executable])
    cmd = launcher + ["-m", "mhc_sp.bench", "model", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def max_abs_diff(stdout):
    values = re.findall(r"^max_abs_diff=(\S+)$", stdout, re.M)
    assert len(values) == 1, stdout
    return float(values[0])


def test_tp2_sp_engaged_with_mtp_and_check():
    r = bench("--tp", "2", "--tokens", "9", "--sp-threshold", "4", "--layers", "2", "--hidden", "96",
              "--mtp", "--check", "--iters", "1")
    assert r.returncode == 0, r.stderr
    assert "SP engaged: yes (token-sharded: 5 stream rows per rank)" in r.stdout
    assert "tokens=9 padded=10" in r.stdout
    assert re.search(r"stage 0: embed [\d.]+  boundary [\d.]+  attention [\d.]+  moe [\d.]+  lm_head [\d.]+  mtp", r.stdout)
    assert 0 < max_abs_diff(r.stdout) < 0.1 and "check: PASS" in r.stdout


def test_pp2_below_threshold_under_torchrun():
    r = bench("--tp", "1", "--pp", "2", "--tokens", "3", "--sp-threshold", "4", "--layers", "2",
              "--hidden", "64", "--check", "--iters", "1", torchrun=2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SP engaged:") == 1  # only the reporting rank prints
    assert "SP engaged: no (SP not configured)" in r.stdout  # tp = 1
    assert re.search(r"stage 0: .*pp_send", r.stdout) and re.search(r"stage 1: pp_recv", r.stdout)
    assert max_abs_diff(r.stdout) < 0.1


# The single-rank path runs in-process (no spawn), so a patched tolerance applies: tp=1 against
# tp=1 is bit-exact (max_abs_diff=0), and a negative tolerance must make the check fail.
CHECK_WITH_NEGATIVE_TOL = """
import sys
import mhc_sp.runner as R
R.logits_tolerance = lambda layers, ref: -1.0
from mhc_sp.bench.cli import main
sys.exit(main(["model", "--tokens", "5", "--layers", "1", "--hidden", "64", "--check", "--iters", "1"]))
"""


def test_check_exits_nonzero_above_tolerance():
    r = subprocess.run([sys.executable, "-c", CHECK_WITH_NEGATIVE_TOL], capture_output=True, text=True,
                       timeout=180, env=dict(os.environ, PYTHONPATH=PYTHON_DIR))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "check: FAIL" in r.stdout and max_abs_diff(r.stdout) == 0.0


@pytest.mark.parametrize("argv,message", [
    (["--tp", "2", "--sp-threshold", "0"], "sp_threshold must be a positive integer, got 0"),
    (["--tp", "2", "--sp-threshold", "8", "--max-cudagraph-capture-size", "8"],
     "sp_threshold=8 must be greater than max_cudagraph_capture_size=8"),
    (["--tp", "2", "--sp-threshold", "16", "--moe-backend", "capacity"],
     "moe_backend='capacity' cannot run on a token shard"),
    (["--tp", "5"], "model.num_heads=12 must be divisible by tensor_parallel_size=5"),
    (["--pp", "3", "--layers", "2"], "model.num_layers=2 must be >= pipeline_parallel_size=3"),
    (["--tokens", "0"], "--tokens must be >= 1, got 0"),
    (["--moe-backend", "fast"], "moe_backend: unknown backend 'fast'"),
])
def test_config_errors_exit_nonzero_with_the_message(argv, message, capsys):
    assert cli.main(["model", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mhc-sp-bench model: error: ") and message in err
    assert "Traceback" not in err


def test_config_error_from_the_console_entry_has_no_traceback():
    r = bench("--tp", "2", "--sp-threshold", "-1")
    assert r.returncode == 2 and "sp_threshold must be a positive integer, got -1" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_usage_errors_and_discovered_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["model", "--tp", "two"])
    assert e.value.code == 2 and "invalid int value: 'two'" in capsys.readouterr().err
    quick = cli.parse_args([])  # no subcommand: the README's main job, a quick layer comparison
    assert quick.command == "layer" and quick.tp == [2] and quick.tokens == [16, 256, 2048]
    names = [m.__name__ for m in cli.subcommand_modules()]
    assert "mhc_sp.bench.model_cmd" in names and all(n.endswith("_cmd") for n in names)
    assert names == sorted(names)
    assert "model" in cli.build_parser().format_help()
