# SPDX-License-Identifier: Apache-2.0
"""What the tests of several subjects share (and the long checks tests/transport/fault_loop.py and
hosts_check.py, run with ``python -m``). No tests here (pytest
collects nothing from this package); each module says what it holds and who uses it:

- boundaries: every fused boundary and collective of one case checked against the reference and
  bit for bit against the single-device ops, and the world worker that runs a list of cases;
- engines: the small model and the engine configurations the runner's tests build;
- faults: faults injected into ranks looping a boundary over shm;
- hosts: separate hosts made of Linux namespaces, and the ranks' scenarios on them;
- projection_bounds: the error a correct fp32 sum in the CUDA projection's order can make;
- reporting_ranks: ranks started as separate interpreters, each reporting one JSON line."""
