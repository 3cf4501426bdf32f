# SPDX-License-Identifier: Apache-2.0
"""mhc_sp's tests, a package so that everything in them is imported by its path from the
repository root (``from tests.helpers.boundaries import worker_fused_ops``).

One package per subject (SUBJECTS), each holding that subject's test modules; ``helpers/`` holds
what the tests of several subjects, and the scripts in bench/, share (workers that ranks run,
harnesses, small configurations), and no tests; ``data/`` holds the golden data and its
generator. pytest puts the repository root on sys.path (it is the folder above the top package),
and ranks started with multiprocessing (spawn or forkserver) inherit the parent's sys.path, so
they import the same modules by the same names."""

#: The subject packages, each holding the tests of one subject: ops (the math ops and their
#: kernels on CPU), transport (collectives, the fused SP ops, shm, gloo and symm host logic,
#: faults, separate hosts, worlds of 8), model (model, runner, plan, configuration), cli
#: (mhc-sp-bench, tune, NVTX profiling), repo (README, docs, lint, repository promises), cuda
#: (everything that needs a GPU or reads the CUDA build), emulated (the CUDA device code run on
#: the host, mhc_sp._emulated) and integrations (the engine plugins, without the engines).
SUBJECTS = ("ops", "transport", "model", "cli", "repo", "cuda", "emulated", "integrations")
