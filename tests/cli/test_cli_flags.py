# SPDX-License-Identifier: Apache-2.0
"""mhc-sp-bench's flags, read from the parser itself: one spelling per flag across subcommands,
the same defaults for the same meaning, help pages with defaults and without markup; every bad
input is refused before any work with exit status 2 and one line naming the flag; the allocator
setting; the version."""

import argparse
import subprocess
import sys

import pytest

from mhc_sp.bench import allocator, checks, cli, flags, machine

#: Spellings that other tools (or this one, earlier) used for flags that now have one name.
RETIRED = {"--tp", "--hidden", "--iters", "--world-size", "--hidden-dim", "--num-tokens"}
#: Where a flag fits, every subcommand has it.
EVERYWHERE = {
    "--json": {"tune", "layer", "comm", "ops", "model", "project", "show"},
    "--csv": {"tune", "layer", "comm", "ops", "model", "project", "show"},
    "--plot": {"tune", "layer", "comm", "ops", "model", "project", "show"},
    "--profile": {"tune", "layer", "comm", "ops", "model"},
    "--repeats": {"tune", "layer", "comm", "ops", "model"},
    "--warmup": {"tune", "layer", "comm", "ops", "model"},
    "--device": {"tune", "layer", "comm", "ops", "model"},
    "--tokens": {"tune", "layer", "ops", "model", "project"},
    "--tensor-parallel-size": {"tune", "layer", "comm", "model", "project"},
    "--hidden-size": {"tune", "layer", "ops", "model", "project"},
    "--hc-mult": {"tune", "layer", "ops", "project"},
}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_one_spelling_per_flag_across_subcommands():
    spellings, dests = {}, {}  # dest -> option strings; option string -> dest
    for name, p in subparsers().items():
        assert not p.allow_abbrev, f"{name}: abbreviations would be second spellings"
        for a in options(p):
            spellings.setdefault(a.dest, set()).add(tuple(a.option_strings))
            for s in a.option_strings:
                dests.setdefault(s, set()).add(a.dest)
    assert {d: s for d, s in spellings.items() if len(s) > 1} == {}
    assert {s: d for s, d in dests.items() if len(d) > 1} == {}
    assert not RETIRED & set(dests)
    # No flag is another flag plus a suffix (--hidden / --hidden-size), except distinct concepts.
    longs = sorted(s for s in dests if s.startswith("--"))
    nested = {(a, b) for a in longs for b in longs if b.startswith(a + "-")}
    assert nested == {("--num-experts", "--num-experts-per-tok")}


def test_shared_flags_are_where_they_fit_with_one_default():
    parsers = subparsers()
    for flag, where in EVERYWHERE.items():
        have = {name for name, p in parsers.items() if flag in p._option_string_actions}
        assert have == where, flag
    for flag in ("--warmup", "--repeats", "--hc-mult", "--device", "--trace"):
        defaults = {
            p._option_string_actions[flag].default
            for p in parsers.values()
            if flag in p._option_string_actions
        }
        assert len(defaults) == 1, (flag, defaults)
    assert flags.REPEATS == parsers["tune"]._option_string_actions["--repeats"].default
    profile = parsers["ops"]._option_string_actions["--profile"]
    assert tuple(profile.choices) == flags.PROFILERS
    # Sweeping subcommands take lists, the others one value.
    assert cli.parse_args(["layer", "-tp", "2,4"]).tensor_parallel_size == [2, 4]
    assert cli.parse_args(["project", "-tp", "2,4"]).tensor_parallel_size == [2, 4]
    assert cli.parse_args(["ops", "--hidden-size", "64,128"]).hidden_size == [64, 128]
    assert cli.parse_args(["model", "--tokens", "8,16"]).tokens == [8, 16]
    assert cli.parse_args(["tune", "-tp", "4"]).tensor_parallel_size == 4


def test_help_pages_show_defaults_and_no_markup():
    for name, p in subparsers().items():
        text = p.format_help()
        assert "`" not in text, name
        for a in options(p):
            assert a.help, f"{name} {a.option_strings[0]} has no help"
            if a.default not in (None, False) and not isinstance(a, argparse._VersionAction):
                shown = p._get_formatter()._get_help_string(a)
                assert "default" in shown, f"{name} {a.option_strings[0]}: {shown}"
    tune = " ".join(subparsers()["tune"].format_help().split())
    assert "(default: 1,4,16,64,256,1024,4096)" in tune
    assert "`" not in cli.build_parser().format_help()


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("mhc-sp-bench 0.") and "torch" in out


def test_bare_command_flags_go_to_the_quick_tune():
    quick = cli.parse_args([])
    assert quick.command == "tune" and quick.argv == ["tune", *cli.QUICK]
    assert quick.tokens == [4, 16, 64, 256, 1024] and quick.repeats == flags.REPEATS
    args = cli.parse_args(["--json", "quick.json", "--tokens", "8,64"])
    assert args.command == "tune" and args.json == "quick.json" and args.tokens == [8, 64]
    assert args.argv == ["tune", "--json", "quick.json", "--tokens", "8,64"]
    assert cli.parse_args(["tune", *cli.QUICK]) == quick
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--hidden", "64"])
    assert e.value.code == 2


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if anything starts measuring."""

    def refuse(*a, **k):
        raise AssertionError("work started before the flags were checked")

    monkeypatch.setattr("mhc_sp.local_world.run_world", refuse)  # tune, layer, comm
    monkeypatch.setattr("mhc_sp.bench.model_cmd.run_world", refuse)
    monkeypatch.setattr("mhc_sp.bench.ops_cmd.measure", refuse)


MISSING = "/nonexistent-folder/out"

BAD = [
    # (argv, text the one error line must contain: the flag)
    (["tune", "--hc-mult", "0"], "--hc-mult"),
    (["tune", "--hc-mult", "9"], "--hc-mult"),
    (["ops", "--hidden-size", "0"], "--hidden-size"),
    (["tune", "--device", "gpu"], "--device"),
    (["comm", "--device", "cuda"], "--device cuda"),
    (["tune", "--device", "cuda"], "--device cuda"),
    (["ops", "--repeats", "0"], "--repeats"),
    (["model", "--repeats", "0"], "--repeats"),
    (["model", "--iters", "3"], "--iters"),
    (["ops", "--threads", "-3"], "--threads"),
    (["layer", "--hidden-size", "-512"], "--hidden-size"),
    (["layer", "--hidden", "512"], "--hidden"),
    (["project", "-tp", "0"], "--tensor-parallel-size"),
    (["project", "--tp", "2"], "--tp"),
    (["project", "--calibrate", "missing.json"], "--calibrate"),
    (["layer", "--profile", "nsys"], "--profile nsys"),
    (["tune", "--profile", "nsys"], "--profile nsys"),
    (["layer", "--profile", "vtune"], "--profile"),
    (["ops", "--json", MISSING + ".json"], "--json"),
    (["tune", "--csv", MISSING + ".csv"], "--csv"),
    (["layer", "--plot", MISSING + ".png"], "--plot"),
    (["comm", "--plot", "out.txt"], "--plot"),
    (["ops", "--profile", "torch", "--trace", MISSING + ".json"], "--trace"),
    (["ops", "--json", "same.json", "--csv", "same.json"], "same file"),
    (["project", "--hidden-size", "-4096"], "--hidden-size"),
    (["project", "--hc-mult", "0"], "--hc-mult"),
    (["project", "--hbm-gbps", "-1"], "--hbm-gbps"),
    (["project", "--link-gbps", "nan"], "--link-gbps"),
    (["layer", "-tp", "1"], "--tensor-parallel-size"),
    (["tune", "-tp", "1"], "--tensor-parallel-size"),
    (["ops", "--warmup", "-1"], "--warmup"),
    (["comm", "--sizes", "0"], "--sizes"),
    (["comm", "--sizes", "1Q"], "--sizes"),
    (["comm", "--sizes", "8K:1K"], "--sizes"),
    (["ops", "--tokens", "abc"], "--tokens"),
    (["ops", "--ops", "nope"], "--ops"),
    (["ops", "--compare", "eager,fast"], "--compare"),
    (["ops", "--budget-s", "-1"], "--budget-s"),
    (["layer", "--transport", "carrier-pigeon"], "--transport"),
    (["layer", "--transport", "shm,shm"], "--transport"),
    (["layer", "--transport", "nccl"], "--transport nccl"),
    (["tune", "--transport", "symm"], "--transport symm"),
    (["tune", "--sp-threshold", "8"], "--sp-threshold"),
    (["model", "--tokens", "0"], "--tokens"),
    (["model", "--requests", "5", "--tokens", "4"], "--requests"),
    (["model", "--timeout", "0"], "--timeout"),
    (["model", "-tp", "2", "--sp-threshold", "8", "--max-cudagraph-capture-size", "8"], "8"),
    (["show", "missing.json"], "missing.json"),
    (["ops", "--tokens", "1000000", "--hidden-size", "65536"], "--tokens, --hidden-size"),
    (["tune", "--tokens", "65536", "--hidden-size", "65536"], "--tokens, --hidden-size"),
    (["comm", "--sizes", "1T"], "--sizes"),
    (["comm", "--sizes", "1024G"], "--sizes"),
    (["no-such-command"], "no-such-command"),
    (["--tp", "2"], "--tp"),
    # Upper bounds: a mistyped value is refused, not run for hours.
    (["tune", "--warmup", "99999999999999999999"], "--warmup"),
    (["--repeats", "1000000"], "--repeats"),
    (["layer", "--tokens", "16,2000000"], "--tokens"),
    (["tune", "--hidden-size", "100000"], "--hidden-size"),
    (["tune", "-tp", "1000"], "--tensor-parallel-size"),
    (["model", "--num-layers", "100000"], "--num-layers"),
    (["model", "--seed", str(2**64)], "--seed"),
    (["model", "--timeout", "1e9"], "--timeout"),
    (["ops", "--threads", "100000"], "--threads"),
    (["project", "--hbm-gbps", "1e12"], "--hbm-gbps"),
    # A count given twice is refused, not measured twice.
    (["tune", "--tokens", "4,4,4"], "--tokens"),
    (["layer", "-tp", "2,2"], "--tensor-parallel-size"),
]


@pytest.mark.parametrize("argv,flag", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2_before_any_work(argv, flag, capsys, no_work, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    captured = capsys.readouterr()
    assert e.value.code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0] and flag in lines[0], captured.err
    assert captured.out == ""


def numeric_options():
    """(subcommand, flag) of every option whose value is a number or a list of numbers."""
    found = []
    for name, p in subparsers().items():
        for a in options(p):
            if a.type is None or a.choices or a.nargs == 0:
                continue
            try:
                value = a.type("1")
            except (argparse.ArgumentTypeError, ValueError, TypeError):
                continue
            values = value if isinstance(value, list) else [value]
            if values and all(isinstance(v, (int, float)) for v in values):
                found.append((name, a.option_strings[0]))
    return found


def test_every_numeric_flag_has_an_upper_bound(capsys, no_work):
    found = numeric_options()
    assert ("tune", "--warmup") in found and ("model", "--num-layers") in found
    assert len(found) > 40
    for name, flag in found:
        with pytest.raises(SystemExit) as e:
            cli.main([name, flag, "9" * 25])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1, (name, flag, err)
        spelled = {flag, *subparsers()[name]._option_string_actions[flag].option_strings}
        assert any(s in err[0] for s in spelled), (name, flag, err)


def test_the_device_is_what_this_machine_can_run(monkeypatch, capsys):
    """Without --device: GPU ranks with a GPU for every rank, else CPU ranks and one line saying
    why and what to run on a GPU node; --device cuda with too few GPUs is a usage error."""
    monkeypatch.setattr(machine, "gpu_count", lambda: 1)
    args = cli.prepare([])
    assert args.device == "cpu"
    assert args.device_note == (
        "mhc-sp-bench tune: 2 ranks on CPU cores (shared memory), since this machine has 1 GPU "
        "and GPU ranks need one GPU each; on a node with 2 GPUs run: mhc-sp-bench tune "
        "--tokens 4,16,64,256,1024 --device cuda"
    )
    assert cli.prepare(["layer", "-tp", "2,4"]).device == "cpu"
    assert cli.prepare(["ops"]).device == "cuda"  # one process, one GPU
    with pytest.raises(SystemExit) as e:
        cli.prepare(["--device", "cuda", "-tp", "2"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2
    assert line.startswith(
        "mhc-sp-bench tune: error: --tensor-parallel-size 2 needs that many GPUs"
    )
    monkeypatch.setattr(machine, "gpu_count", lambda: 2)
    args = cli.prepare([])
    assert args.device == "cuda" and not getattr(args, "device_note", None)
    assert cli.prepare(["layer", "-tp", "2,4"]).device == "cpu"
    assert cli.prepare(["model", "-tp", "2", "--device", "cuda"]).device == "cuda"
    monkeypatch.setattr(machine, "gpu_count", lambda: 0)
    args = cli.prepare([])
    assert args.device == "cpu" and "since this machine has no GPU" in args.device_note


GUARDED = r"""
import sys, torch
torch.__version__ = sys.argv[1]  # the extension was built for another torch than this one
sys.argv = ["mhc-sp-bench", "show", "x.json"]  # as the console script starts
from mhc_sp.bench.cli import main
sys.exit(main())
"""


def test_a_torch_mismatch_is_one_line_and_exit_2():
    import os

    import torch

    import mhc_sp

    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    env = {k: v for k, v in os.environ.items() if k != mhc_sp.ALLOW_MISMATCH_ENV}
    other = f"{major}.{minor + 1}.0"
    proc = subprocess.run(
        [sys.executable, "-c", GUARDED, other], capture_output=True, text=True, timeout=120, env=env
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("mhc-sp-bench: error: mhc_sp: its extension mhc_sp._C was built")
    assert mhc_sp.ALLOW_MISMATCH_ENV in lines[0] and "Traceback" not in proc.stderr


def test_show_refuses_a_file_without_results(tmp_path, capsys):
    path = tmp_path / "x.json"
    path.write_text('{"kind": "tune"}')
    with pytest.raises(SystemExit):
        cli.main(["show", str(path)])
    assert "has no result rows" in capsys.readouterr().err
    path.write_text("not json")
    with pytest.raises(SystemExit):
        cli.main(["project", "--calibrate", str(path)])
    assert "is not a JSON file" in capsys.readouterr().err


def test_nsys_is_refused_without_a_gpu_or_nsys(monkeypatch):
    assert "needs --device cuda" in checks.profiler_problem("nsys", "cpu")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert "nsys is not installed" in checks.profiler_problem("nsys", "cuda")
    monkeypatch.setenv("NSYS_TARGET_STD_REDIRECT_ACTIVE", "1")  # set by nsys profile
    assert checks.profiler_problem("nsys", "cuda") is None
    assert checks.profiler_problem("torch", "cpu") is None


def test_oversubscription_and_a_busy_machine_warn_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(machine, "available_cores", lambda: 2)
    monkeypatch.setattr(machine.os, "getloadavg", lambda: (6.5, 1.0, 1.0))
    machine.warn_busy("mhc-sp-bench ops")
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("mhc-sp-bench ops: warning: this machine is busy (load average 6.5 ")
    monkeypatch.setattr(machine.os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    machine.warn_busy("mhc-sp-bench ops")
    assert capsys.readouterr().err == ""
    machine.warn_oversubscribed("mhc-sp-bench tune", 4, 1)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("mhc-sp-bench tune: warning: 4 ranks x 1 thread(s) = 4 > 2 cores")
    machine.warn_oversubscribed("mhc-sp-bench tune", 2, 1)
    assert capsys.readouterr().err == ""
    assert machine.threads_per_rank(4, None) == 1 and machine.threads_per_rank(1, None) == 2


def test_allocator_is_described_and_set_for_spawned_ranks(monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    if not allocator._is_glibc():
        pytest.skip("not glibc")
    assert "default settings" in allocator.describe()
    line = allocator.apply(measures_here=False, from_command_line=False)
    assert line == f"allocator: {allocator.describe()}" and "kept for reuse" in line
    import os

    assert os.environ["GLIBC_TUNABLES"] == allocator.TUNABLES  # spawned ranks inherit it
    monkeypatch.delenv("GLIBC_TUNABLES")
    line = allocator.apply(measures_here=True, from_command_line=False)  # no restart from Python
    assert "default settings" in line and "in this process" in line
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert allocator.apply(True, True).startswith("allocator: jemalloc")
    assert "GLIBC_TUNABLES" not in os.environ  # a preloaded allocator is left alone


def test_the_command_line_restarts_once_with_the_allocator(tmp_path):
    """From the command line, a command that measures in its own process is restarted once with
    the allocator setting, says so in one line, and records it."""
    import os

    hidden = ("GLIBC_TUNABLES", "LD_PRELOAD", allocator.RESTARTED)
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    out = tmp_path / "ops.json"
    argv = ["ops", "--tokens", "1", "--hidden-size", "64", "--ops", "mhc_post", "--compare"]
    argv += ["none", "--repeats", "1", "--warmup", "0", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "mhc_sp.bench", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    if not allocator._is_glibc():
        return
    said = [line for line in proc.stderr.splitlines() if "allocator:" in line]
    assert said == [
        f"mhc-sp-bench: allocator: {allocator.describe({'GLIBC_TUNABLES': allocator.TUNABLES})}"
    ]
    doc = __import__("json").loads(out.read_text())
    assert "freed memory kept for reuse" in doc["environment"]["allocator"]
    assert doc["command"] == "mhc-sp-bench " + " ".join(argv)
