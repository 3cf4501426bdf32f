# SPDX-License-Identifier: Apache-2.0
"""bench/gpu_check.sh without a GPU: its shape (steps, phases, limits and the header's estimate of
phase 1), its arguments (--phase, --only), its MPS detection on a made-up /proc and pipe
directory, its verdicts (bench/gpu_check_summary.py on real pytest reports of made-up tests and
on made-up step results), whole runs with a stand-in python, and bench/build_times.py on a
made-up ninja log."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
TESTS = ROOT / "tests"

PHASE1 = ["build", "build_info", "cubin_gate", "cuda_tests", "symm_sim", "symm_world"]
PHASE2 = ["memcheck", "symm_timings", "op_bench"]
#: The order the steps run in, most valuable first.
STEPS = PHASE1 + PHASE2
#: Each step's limit variable.
LIMITS = {
    "build": "T_BUILD",
    "build_info": "T_INFO",
    "cubin_gate": "T_GATE",
    "cuda_tests": "T_TESTS",
    "symm_sim": "T_SIM",
    "symm_world": "T_WORLD",
    "memcheck": "T_SANITIZER",
    "symm_timings": "T_TIMING",
    "op_bench": "T_BENCH",
}


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


summary = load("gpu_check_summary")
build_times = load("build_times")


def text() -> str:
    return SCRIPT.read_text()


def bash_array(name: str) -> list[str]:
    (body,) = re.findall(rf"^{name}=\((.*?)\)$", text(), re.M)
    return body.split()


def sourced(code: str, **env) -> subprocess.CompletedProcess:
    """Runs `code` in bash after sourcing the script (its functions only)."""
    return subprocess.run(
        ["bash", "-c", f"source {shlex.quote(str(SCRIPT))}\n{code}"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
    )


# ---- shape ----------------------------------------------------------------------------------


def test_script_parses_and_lists_its_steps_in_order():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    assert bash_array("PHASE1_STEPS") == PHASE1
    assert bash_array("PHASE2_STEPS") == PHASE2
    # every step has a function that runs it
    defined = re.findall(r"^run_(\w+)\(\) \{", text(), re.M)
    assert sorted(defined) == sorted(STEPS)


def test_script_runs_every_cuda_test_file():
    cuda_files = sorted(p.relative_to(ROOT).as_posix() for p in TESTS.glob("cuda/test_*.py"))
    assert cuda_files
    missing = [name for name in cuda_files if name not in text()]
    assert not missing, missing


def limits() -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^\s*(T_[A-Z]+)=\$\{T_[A-Z]+:-(\d+)\}", text(), re.M)}


def estimate_table() -> dict[str, tuple[int, int]]:
    """{step: (measured s, limit s)} from the header's phase-1 table."""
    rows = re.findall(r"^#   (\w+(?: 1)?) +(\d+) s +(\d+) s ", text(), re.M)
    return {name: (int(e), int(lim)) for name, e, lim in rows}


def test_header_times_phase_1_under_five_minutes_within_its_limits():
    table = estimate_table()
    assert list(table) == [*PHASE1, "phase 1"], list(table)
    total_estimate, total_limit = table.pop("phase 1")
    lim = limits()
    for step, (estimate, limit) in table.items():
        assert limit == lim[LIMITS[step]], (step, limit, lim[LIMITS[step]])
        assert 0 < estimate < limit, step  # room for a slower machine
    assert total_estimate == sum(e for e, _ in table.values())
    assert total_limit == sum(limit for _, limit in table.values())
    assert total_estimate < 5 * 60
    # The whole run is bounded so that its summary is written within ten minutes.
    assert lim["T_TOTAL"] < 10 * 60
    assert sum(lim[LIMITS[s]] for s in PHASE2) + lim[LIMITS["build"]] <= lim["T_TOTAL"]


def test_header_times_are_the_recorded_h200_ones():
    recorded = json.loads((ROOT / "bench/results/gpu_check_h200.json").read_text())
    table = {step: measured for step, (measured, _) in estimate_table().items()}
    want = recorded["phase_1_s"]
    assert table == {**{s: want[s] for s in PHASE1}, "phase 1": want["total"]}


def test_memcheck_counts_only_memory_errors_of_mhc_sp_kernels():
    joined = text().replace("\\\n", " ")
    (line,) = re.findall(r"step memcheck .*?compute-sanitizer (.*?) \"\$PY\"", joined)
    flags = line.split()
    assert flags[:2] == ["--tool", "memcheck"]
    assert "--report-api-errors no" in line  # torch's deliberate failing API calls
    assert "--kernel-name kns=mhc_sp" in line  # only our kernels instrumented
    assert re.search(r"--error-exitcode \d+", line)
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING=1" in joined  # every tensor its own allocation
    # the warm-up comes before the checked region, which is timed apart
    snippet = re.findall(r"\"\$PY\" -c '(.*?)'\n", text(), re.S)[-1]
    assert snippet.index("warm-up") < snippet.index("for i in op_inputs")


def test_python_snippets_compile_and_benchmark_flags_parse():
    """What only a GPU machine runs must at least compile and parse here."""
    from mhc_sp.bench import cli

    snippets = re.findall(r"\"\$PY\" -c '(.*?)'\n", text(), re.S)
    assert len(snippets) >= 2
    for code in snippets:
        compile(code, "gpu_check.sh", "exec")
    joined = text().replace("\\\n", " ")
    (bench,) = re.findall(r"^\s*step op_bench .*? -m mhc_sp\.bench (ops .*?)$", joined, re.M)
    argv = shlex.split(re.sub(r"\$\(\([^)]*\)\)|\$\w+|\$\{\w+\}", "1", bench))
    args = cli.build_parser().parse_args(argv)
    assert args.device == "cuda" and args.budget_s > 0 and args.json


# ---- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,selected",
    [
        ("", STEPS),
        ("--phase 1", PHASE1),
        ("--phase=2", ["build", *PHASE2]),
        ("--only symm_world,cuda_tests", ["build", "cuda_tests", "symm_world"]),
        ("--only=op_bench,build", ["build", "op_bench"]),
        ("--only memcheck,", ["build", "memcheck"]),
    ],
)
def test_selection(args, selected):
    out = sourced(f'parse_args {args}; echo "rc=$? ${{SELECTED[*]}}"')
    assert out.stdout.split() == ["rc=0", *selected], out.stderr
    assert out.stderr == ""


@pytest.mark.parametrize(
    "args,message",
    [
        ("--only foo", r"^--only: unknown step 'foo' in 'foo' \(steps: build build_info "),
        ("--only ,symm_sim", r"^--only: unknown step '' in ',symm_sim'"),
        ("--only=", r"^--only: expected a comma-separated list of steps"),
        ("--only", r"^--only: expected a value"),
        ("--phase 3", r"^--phase: expected 1 or 2, got '3'"),
        ("--phase 1 --only build", r"^--only and --phase: give one of them"),
        ("--fast", r"^gpu_check.sh: unknown argument '--fast'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, message, tmp_path):
    out = subprocess.run(
        ["bash", str(SCRIPT), *shlex.split(args)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "OUT": str(tmp_path / "out")},
    )
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and re.match(message, lines[0]), out.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


def test_help_prints_the_steps_and_exits_0():
    out = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("usage: bash bench/gpu_check.sh")
    assert all(s in out.stdout for s in STEPS)


# ---- MPS ------------------------------------------------------------------------------------


def fake_proc(root: Path, processes: dict[int, str]) -> Path:
    for pid, comm in processes.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
    (root / "self").mkdir(exist_ok=True)  # not a pid: never read
    return root


def test_mps_daemon_found_by_its_process(tmp_path):
    # /proc/PID/comm holds 15 characters: nvidia-cuda-mps-control and -server both read so
    proc = fake_proc(tmp_path / "proc", {1: "systemd", 4321: "nvidia-cuda-mps", 77: "python3"})
    out = sourced(f"mps_daemon {proc} {tmp_path / 'no-pipe'}")
    assert out.returncode == 0
    assert out.stdout.strip() == "an MPS daemon runs (process 4321, nvidia-cuda-mps)"


def test_mps_daemon_found_by_its_control_pipe(tmp_path):
    proc = fake_proc(tmp_path / "proc", {1: "systemd"})
    pipe = tmp_path / "mps"
    pipe.mkdir()
    os.mkfifo(pipe / "control")
    out = sourced(f"mps_daemon {proc} {pipe}")
    assert out.returncode == 0
    assert out.stdout.strip() == f"an MPS daemon's control pipe exists ({pipe}/control)"
    # the default pipe directory follows CUDA_MPS_PIPE_DIRECTORY
    out = sourced(f"mps_daemon {proc}", CUDA_MPS_PIPE_DIRECTORY=str(pipe))
    assert out.returncode == 0 and "control pipe exists" in out.stdout


def test_no_mps_daemon(tmp_path):
    proc = fake_proc(tmp_path / "proc", {1: "systemd", 2: "nvidia-smi"})
    pipe = tmp_path / "mps"
    pipe.mkdir()
    (pipe / "control").write_text("")  # a plain file is not the daemon's pipe
    out = sourced(f"mps_daemon {proc} {pipe}")
    assert out.returncode == 1 and out.stdout == ""


# ---- compute-sanitizer's refusal ------------------------------------------------------------


def fake_tool(bin_dir: Path, name: str, body: str) -> dict:
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text("#!/usr/bin/env bash\n" + body + "\n")
    tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PY": sys.executable}


def test_a_sanitizer_that_refuses_the_device_skips_memcheck(tmp_path):
    # what a gVisor runtime printed for an H200: the device refused, then error 999
    env = fake_tool(
        tmp_path / "bin",
        "compute-sanitizer",
        'echo "========= Error: Device not supported"\n'
        'echo "RuntimeError: CUDA error: unknown error (error 999)" >&2\nexit 1',
    )
    out = sourced('PY=$PY; sanitizer_refusal; echo "rc=$?"', **env)
    assert "rc=0" in out.stdout, out
    assert "cannot run a CUDA program on this GPU (rc=1)" in out.stdout
    assert "Device not supported" in out.stdout


def test_a_working_sanitizer_is_not_a_refusal(tmp_path):
    env = fake_tool(tmp_path / "bin", "compute-sanitizer", 'echo "ERROR SUMMARY: 0 errors"')
    out = sourced('PY=$PY; sanitizer_refusal; echo "rc=$?"', **env)
    assert out.stdout.strip() == "rc=1", out


def test_memcheck_probes_the_sanitizer_before_it_runs():
    body = re.search(r"^run_memcheck\(\) \{(.*?)^\}", text(), re.S | re.M).group(1)
    assert body.index("sanitizer_refusal") < body.index("step memcheck")
    assert 'skip memcheck "$why"' in body


# ---- verdicts -------------------------------------------------------------------------------

HARDWARE = "2 ranks need 2 GPUs or NCCL_MULTI_RANK_GPU_ENABLE=1 with NCCL >= 2.30"
FAKE_TESTS = f"""
import pytest

def test_passes():
    print("record: 3 elements differ")
    print("not a record")
    assert True

def test_needs_two_gpus():
    pytest.skip({HARDWARE!r})

def test_needs_cuobjdump():
    pytest.skip("no cuobjdump: install the CUDA toolkit")

@pytest.mark.skipif(True, reason="3 ranks need 3 GPUs")
def test_needs_three_gpus():
    pass
"""


@pytest.fixture(scope="module")
def junit(tmp_path_factory):
    """Real pytest reports of made-up tests: every test, and every test but the cuobjdump one."""
    d = tmp_path_factory.mktemp("junit")
    (d / "test_fake.py").write_text(FAKE_TESTS)
    reports = {}
    for name, select in (("all", []), ("hardware_only", ["-k", "not cuobjdump"])):
        xml = d / f"{name}.xml"
        subprocess.run(
            # as bench/gpu_check.sh's pytest_step runs them
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
            + ["-o", "junit_logging=system-out"]
            + select
            + [str(d / "test_fake.py")],
            cwd=d,
            capture_output=True,
            timeout=60,
            check=True,
        )
        reports[name] = summary.read_junit(str(xml))
    return reports


def test_junit_report_is_read(junit):
    report = junit["all"]
    assert report["counts"] == {"tests": 4, "failures": 0, "errors": 0, "skipped": 3}
    assert report["records"] == ["3 elements differ"]
    reasons = sorted(s["reason"] for s in report["skipped"])
    assert reasons == sorted(
        [HARDWARE, "no cuobjdump: install the CUDA toolkit", "3 ranks need 3 GPUs"]
    )


def test_hardware_skips_keep_a_step_ok_on_a_machine_without_the_hardware(junit):
    rec = summary.step_record("cuda_tests", 0, 70, 150, junit["hardware_only"], gpus=1)
    assert rec["status"] == "ok"
    assert rec["records"] == ["3 elements differ"]
    assert len(rec["hardware_skips"]) == 2 and rec["skipped_tests"] == []
    # with the GPUs there, the same skips mean the tests did not run what they could: partial
    rec = summary.step_record("cuda_tests", 0, 70, 150, junit["hardware_only"], gpus=2)
    assert rec["status"] == "partial"
    assert [s["reason"] for s in rec["skipped_tests"]] == [HARDWARE]
    assert summary.step_record("t", 0, 1, 9, junit["hardware_only"], gpus=3)["status"] == "partial"


def test_other_skips_make_a_step_partial(junit):
    rec = summary.step_record("cubin_gate", 0, 5, 30, junit["all"], gpus=1)
    assert rec["status"] == "partial"
    assert [s["reason"] for s in rec["skipped_tests"]] == ["no cuobjdump: install the CUDA toolkit"]


def test_statuses_from_exit_status_and_counts():
    every_skip = {
        "counts": {"tests": 2, "failures": 0, "errors": 0, "skipped": 2},
        "failed": [],
        "skipped": [{"test": "a", "reason": HARDWARE}, {"test": "b", "reason": HARDWARE}],
    }
    assert summary.step_record("s", 0, 1, 9, every_skip, gpus=1)["status"] == "skipped"
    assert summary.step_record("s", 1, 1, 9, every_skip, gpus=1)["status"] == "failed"
    assert summary.step_record("s", 124, 9, 9)["status"] == "timeout"
    assert summary.step_record("s", 137, 9, 9)["status"] == "timeout"
    assert summary.step_record("s", 3, 9, 9)["status"] == "failed"
    assert summary.step_record("s", 0, 9, 9)["status"] == "ok"  # no pytest report: the rc decides


@pytest.mark.parametrize(
    "statuses,ok",
    [
        (["ok", "ok"], True),
        (["ok", "partial"], False),
        (["ok", "skipped"], False),
        (["failed", "ok"], False),
        (["timeout"], False),
        ([], False),
    ],
)
def test_run_is_ok_only_when_every_step_is_ok(statuses, ok, tmp_path):
    steps = tmp_path / "steps.jsonl"
    lines = [json.dumps({"name": f"s{k}", "status": s}) for k, s in enumerate(statuses)]
    steps.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "summary.json"
    rc = summary.main(["verdict", str(steps), str(out), "--gpus", "1", "--selection", "build,s1"])
    written = json.loads(out.read_text())
    assert written["ok"] is ok and (rc == 0) is ok
    assert [s["status"] for s in written["steps"]] == statuses
    assert written["selection"] == ["build", "s1"] and written["gpus"] == 1


# ---- whole runs with a stand-in python ------------------------------------------------------


def stand_in_python(tmp_path: Path, build_rc: int) -> Path:
    """A python that runs the script's own helpers with this python, "builds" with exit status
    `build_rc` and fails everything else (so that no step needs a GPU)."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  */gpu_check_summary.py|*/build_times.py) exec {sys.executable} "$@" ;;\n'
        f"  setup.py) exit {build_rc} ;;\n"
        "esac\n"
        "exit 7\n"
    )
    fake.chmod(0o755)
    return fake


def run_script(tmp_path: Path, build_rc: int, *args: str, **env) -> tuple[int, dict]:
    out = tmp_path / "out"
    full_env = {
        **os.environ,
        "PYTHON": str(stand_in_python(tmp_path, build_rc)),
        "OUT": str(out),
        "PATH": "/usr/bin:/bin",  # no nvidia-smi, no compute-sanitizer
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "no-mps"),
        **env,
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), *args], env=full_env, timeout=60, capture_output=True, text=True
    )
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log", "summary.json"]
    return done.returncode, json.loads((out / "summary.json").read_text())


def test_failed_build_skips_every_other_step(tmp_path):
    rc, s = run_script(tmp_path, 7)
    status = {step["name"]: step["status"] for step in s["steps"]}
    assert list(status) == STEPS
    assert status["build"] == "failed"
    assert [k for k, v in status.items() if v == "skipped"] == STEPS[1:]
    assert s["ok"] is False and rc == 1
    assert s["selection"] == STEPS


def test_rerun_of_named_steps_skips_the_world_under_mps(tmp_path):
    pipe = tmp_path / "mps"
    pipe.mkdir()
    os.mkfifo(pipe / "control")
    rc, s = run_script(
        tmp_path, 0, "--only", "symm_world,build_info", CUDA_MPS_PIPE_DIRECTORY=str(pipe)
    )
    steps = {step["name"]: step for step in s["steps"]}
    assert list(steps) == ["build", "build_info", "symm_world"]
    assert steps["build"]["status"] == "ok"
    assert steps["build_info"]["status"] == "failed"  # the stand-in python fails it
    assert steps["symm_world"]["status"] == "skipped"
    assert steps["symm_world"]["reason"].startswith("an MPS daemon's control pipe exists")
    assert s["ok"] is False and rc == 1


def test_phase_2_without_compute_sanitizer_skips_memcheck(tmp_path):
    rc, s = run_script(tmp_path, 0, "--phase", "2")
    steps = {step["name"]: step for step in s["steps"]}
    assert list(steps) == ["build", *PHASE2]
    assert steps["memcheck"] == {
        "name": "memcheck",
        "status": "skipped",
        "reason": "compute-sanitizer not found",
    }
    assert rc == 1


# ---- bench/build_times.py -------------------------------------------------------------------

# Entries in the order the jobs finished, as ninja writes them.
NINJA_LOG = """# ninja log v5
1\t8\t0\tbuild/CMakeFiles/cmake.verify_globs\tx
9\t12009\t0\tCMakeFiles/_C.dir/csrc/registration.cpp.o\tx
12009\t62009\t0\tCMakeFiles/_C.dir/csrc/cuda/mhc_pre.cu.o\tx
62009\t72009\t0\tCMakeFiles/_C.dir/csrc/ops/sp_ops.cpp.o\tx
9\t90009\t0\tCMakeFiles/s.dir/csrc/transport/symm/collective_launch.cu.o\tx
90009\t90609\t0\tmhc_sp/_C.cpython-311-x86_64-linux-gnu.so\tx
1\t8\t0\tbuild/CMakeFiles/cmake.verify_globs\tx
"""


def test_build_times_reads_the_last_build_that_compiled(tmp_path):
    log = tmp_path / ".ninja_log"
    log.write_text(NINJA_LOG)  # a full build, then a run with nothing to do
    s = build_times.summarise(build_times.read_last_run(str(log)), cores=16)
    assert (s["cuda_units"], s["cxx_units"]) == (2, 2)
    assert s["compile_s_total"] == 90.0 + 12.0 + 50.0 + 10.0
    assert s["longest"]["output"].endswith("collective_launch.cu.o")
    assert s["estimate_s"] == 90.0 + 0.6  # the longest unit, then the link
    two = build_times.summarise(build_times.read_last_run(str(log)), cores=2)
    assert two["estimate_s"] == 90.0 + 0.6  # 90 | 50 + 12 + 10: the longest still bounds it
    one = build_times.summarise(build_times.read_last_run(str(log)), cores=1)
    assert one["estimate_s"] == 162.0 + 0.6


def test_build_times_command_line(tmp_path):
    log = tmp_path / ".ninja_log"
    log.write_text(NINJA_LOG)
    out = tmp_path / "times.json"
    tool = [sys.executable, str(ROOT / "bench" / "build_times.py")]
    done = subprocess.run([*tool, str(log), "--json", str(out)], capture_output=True, text=True)
    assert done.returncode == 0 and "2 CUDA and 2 C++ translation units" in done.stdout
    assert json.loads(out.read_text())["cores"] == 16
    top = subprocess.run([*tool, str(log), "--top", "1"], capture_output=True, text=True)
    lines = top.stdout.splitlines()
    assert len(lines) == 2 and lines[0].endswith("collective_launch.cu.o")
    assert "on 16 cores" in lines[1]
    for args, message in (
        ([str(log), "--cores", "0"], "--cores: expected at least 1, got 0"),
        ([str(tmp_path / "missing")], "ninja_log: cannot read"),
    ):
        bad = subprocess.run([*tool, *args], capture_output=True, text=True)
        assert bad.returncode == 2 and bad.stderr.startswith(message), bad.stderr
        assert "Traceback" not in bad.stderr
