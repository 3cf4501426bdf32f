# SPDX-License-Identifier: Apache-2.0
"""Ranks on two hosts that are really separate (namespaces of their own joined by a veth pair,
tests/helpers/hosts.py; needs root): what transport="auto" picks and why, whether the
results are bitwise those of one host, the tp=2 x pp=2 model check, and how long each rank takes
to raise once the link between the hosts goes down. Writes JSON.

    sudo .venv/bin/python -m tests.transport.hosts_check --json bench/results/hosts.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from mhc_sp.local_world import run_world
from tests.helpers import hosts as H

#: How this check is run, from the repository root (its record's "command").
COMMAND = ("python", "-m", "tests.transport.hosts_check")


def cut_times(results: list[dict]) -> list[float | None]:
    cut_at = results[0]["cut_at"]
    return [None if r["raised_at"] is None else r["raised_at"] - cut_at for r in results]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True)
    args = p.parse_args()
    why = H.unavailable()
    if why:
        print(f"hosts_check: {why}", file=sys.stderr)
        return 2
    doc = {
        "kind": "hosts",
        "command": shlex.join([*COMMAND, *sys.argv[1:]]),
        "gloo_timeout_s": H.COLLECTIVE_TIMEOUT_S,
        "load_average_at_start": os.getloadavg(),
    }
    with H.Hosts() as hosts:
        outs = [hosts.drive(k, 2, [k], "span", "--cut") for k in range(2)]
        span = hosts.wait(outs, timeout=240)
    one_host = run_world(2, H.span_worker, False, start="forkserver")
    doc["tp2_across_hosts"] = {
        "hostnames": [r["hostname"] for r in span],
        "transport": [r["transport"] for r in span],
        "why": span[0]["why"],
        "shm_requested": span[0]["shm_error"],
        "one_host_transport": [r["transport"] for r in one_host],
        "bitwise_equal_to_one_host": [r["digests"] for r in span]
        == [r["digests"] for r in one_host],
        "cases": len(H.SPAN_CASES),
        "link_cut_raise_s": cut_times(span),
        "link_cut_raised": [f"{r['type']}: {r['message']}" for r in span],
    }
    with H.Hosts() as hosts:
        outs = [hosts.drive(k, 4, [2 * k, 2 * k + 1], "tp_pp", "--cut") for k in range(2)]
        tp_pp = hosts.wait(outs, timeout=400)
    doc["tp2_in_each_host_pp2_across"] = {
        "tp_transport": [r["tp_transport"] for r in tp_pp],
        "why": tp_pp[0]["why"],
        "sharded": [r["sharded"] for r in tp_pp],
        "last_stage_max_abs_diff_vs_tp1": [r.get("max_diff") for r in tp_pp[2:]],
        "tolerance": tp_pp[2]["tolerance"],
        "link_cut_raise_s": cut_times(tp_pp),
        "link_cut_raised": [f"{r['type']}: {r['message']}" for r in tp_pp],
    }
    doc["load_average_at_end"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
