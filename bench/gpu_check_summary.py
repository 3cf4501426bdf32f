# SPDX-License-Identifier: Apache-2.0
"""The verdicts of bench/gpu_check.sh: each step's status from its exit status and its pytest
report (junit XML), and the run's summary. Standard library only (the GPU machine's python may
lack anything else); tests/repo/test_gpu_check.py runs it on made-up step results.

A step's status:
  timeout  its command ran past its limit (exit status 124 or 137);
  failed   any other non-zero exit status;
  skipped  it did not run (recorded by ``skip``), or every one of its tests skipped;
  partial  it passed, but some tests skipped for a reason that is not a listed hardware one (the
           machine lacks what the test needs: HARDWARE_SKIPS), so part of it checked nothing;
  ok       it passed, every test that did not run skipped for a listed hardware reason.
The run is ok only when it recorded at least one step and every step is ok.

  gpu_check_summary.py record STEPS --name N --rc RC --seconds S --limit L [--junit F] [--gpus G]
  gpu_check_summary.py skip STEPS --name N --reason WHY
  gpu_check_summary.py verdict STEPS SUMMARY [--host H] [--gpu NAME] [--gpus G] [--seconds S]
                               [--selection STEP,...]
record and skip append one JSON line to STEPS and print the step's status; verdict writes
SUMMARY (JSON), prints one line, "summary: ok ..." or "summary: NOT ok ...", and exits 0 only
when the run is ok.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET

#: Skip reasons that follow from the machine, not from the check: (pattern, what it needs). A test
#: that needs more GPUs than the machine has ("N ranks need N GPUs ...", tests/cuda/test_nccl.py)
#: is a hardware skip only on a machine with fewer than N GPUs.
HARDWARE_SKIPS = [(re.compile(r"\b(\d+) ranks need \1 GPUs\b"), "gpus")]

STATUSES = ("ok", "partial", "skipped", "failed", "timeout")


def hardware_skip(reason: str, gpus: int) -> bool:
    """Whether a test skipped for `reason` lacks only hardware this machine (`gpus` GPUs) does not
    have."""
    for pattern, need in HARDWARE_SKIPS:
        m = pattern.search(reason)
        if m and need == "gpus" and gpus < int(m.group(1)):
            return True
    return False


#: A test's printed line that goes into the summary (pytest_step keeps the tests' output in the
#: junit file): what a passing test measured, e.g. how many elements differ in bits from the
#: emulated device.
RECORD_PREFIX = "record: "


def read_junit(path: str) -> dict:
    """{"tests", "failures", "errors", "skipped"} counts, the failed and skipped tests (with
    messages) and the lines the tests printed starting with RECORD_PREFIX, of a pytest junit
    report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {
        k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")
    }
    failed, skipped, records = [], [], []
    for case in root.iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        for out in case.findall("system-out"):
            lines = (out.text or "").splitlines()
            records += [
                line[len(RECORD_PREFIX) :] for line in lines if line.startswith(RECORD_PREFIX)
            ]
        for kind in ("failure", "error"):
            for e in case.findall(kind):
                failed.append({"test": test, "message": (e.get("message") or "")[:300]})
        for e in case.findall("skipped"):
            skipped.append({"test": test, "reason": (e.get("message") or "")[:200]})
    return {"counts": counts, "failed": failed, "skipped": skipped, "records": records}


def step_record(
    name: str, rc: int, seconds: int, limit: int, junit: dict | None = None, gpus: int = 0
) -> dict:
    """The summary's entry for a step that ran: its status (see the module's docstring), and for a
    pytest step its counts, failed tests, and skipped tests split into hardware and other skips."""
    rec = {"name": name, "rc": rc, "seconds": seconds, "limit": limit}
    if rc in (124, 137):
        status = "timeout"
    elif rc != 0:
        status = "failed"
    else:
        status = "ok"
    if junit is not None:
        hardware = [s for s in junit["skipped"] if hardware_skip(s["reason"], gpus)]
        other = [s for s in junit["skipped"] if not hardware_skip(s["reason"], gpus)]
        tests = junit["counts"]["tests"]
        if status == "ok" and tests and junit["counts"]["skipped"] == tests:
            status = "skipped"  # ran, but checked nothing
        elif status == "ok" and other:
            status = "partial"
        rec.update(
            pytest=junit["counts"],
            failed_tests=junit["failed"],
            skipped_tests=other,
            hardware_skips=hardware,
        )
        if junit.get("records"):
            rec["records"] = junit["records"]
    rec["status"] = status
    return rec


def skip_record(name: str, reason: str) -> dict:
    return {"name": name, "status": "skipped", "reason": reason}


def verdict(steps: list[dict]) -> bool:
    """ok only when there are steps and every one of them is ok."""
    return bool(steps) and all(s["status"] == "ok" for s in steps)


def summary_line(steps: list[dict]) -> str:
    ok = verdict(steps)
    listed = ", ".join(f"{s['name']} {s['status']}" for s in steps)
    return f"summary: {'ok' if ok else 'NOT ok'} ({listed})"


def read_steps(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def append(path: str, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_check_summary.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("steps")
    r.add_argument("--name", required=True)
    r.add_argument("--rc", type=int, required=True)
    r.add_argument("--seconds", type=int, required=True)
    r.add_argument("--limit", type=int, required=True)
    r.add_argument("--junit")
    r.add_argument("--gpus", type=int, default=0)
    s = sub.add_parser("skip")
    s.add_argument("steps")
    s.add_argument("--name", required=True)
    s.add_argument("--reason", required=True)
    v = sub.add_parser("verdict")
    v.add_argument("steps")
    v.add_argument("summary")
    v.add_argument("--host", default="")
    v.add_argument("--gpu", default="")
    v.add_argument("--gpus", type=int, default=0)
    v.add_argument("--seconds", type=int, default=0)
    v.add_argument("--selection", default="")
    a = p.parse_args(argv)
    if a.cmd == "record":
        junit = None
        if a.junit:
            try:
                junit = read_junit(a.junit)
            except (OSError, ET.ParseError):
                junit = None  # pytest did not get to write it: the exit status decides
        rec = step_record(a.name, a.rc, a.seconds, a.limit, junit, a.gpus)
        append(a.steps, rec)
        print(rec["status"])
    elif a.cmd == "skip":
        rec = skip_record(a.name, a.reason)
        append(a.steps, rec)
        print(rec["status"])
    else:
        steps = read_steps(a.steps)
        out = {
            "host": a.host,
            "gpu": a.gpu,
            "gpus": a.gpus,
            "selection": [x for x in a.selection.split(",") if x],
            "seconds": a.seconds,
            "steps": steps,
            "ok": verdict(steps),
        }
        with open(a.summary, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        print(summary_line(steps))
        return 0 if out["ok"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
