#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CPU benchmarks recorded in bench/results/ (the README quotes these files).
# Run on an otherwise idle machine: bash bench/cpu_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=.venv/bin/mhc-sp-bench
# Freed blocks stay in glibc's heap instead of being unmapped: otherwise every large output (the
# ops' and the references' alike) page-faults and is zeroed again on each call, and how often
# depends on the allocation history (README: "Large outputs and glibc").
export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296
mkdir -p bench/results
# Math ops at decode and prefill sizes, against one fp32 GEMM, the eager and the compiled reference.
$BENCH ops --device cpu --tokens 1,16,256 --hidden 4096 --gemm --repeats 60 \
  --json bench/results/cpu_ops.json
# One SP boundary on 2 ranks of one thread each: fused vs replicated vs separate ops, over shared
# memory and over gloo in the same run; also gives the sharded-vs-replicated crossover.
$BENCH layer --device cpu --tp 2 --tokens 2,4,8,16,32,64,128,256,512,1024,2048,4096 --hidden 4096 \
  --threads 1 --transport shm,gloo --repeats 15 --json bench/results/cpu_layer.json
