#!/usr/bin/env bash
# CPU benchmarks recorded in bench/results/ (issue numbers in the notes refer to these files).
# Run on an otherwise idle machine: bash bench/cpu_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=.venv/bin/mhc-sp-bench
mkdir -p bench/results
# Math ops at decode and prefill sizes, against one fp32 GEMM, the eager and the compiled reference.
$BENCH ops --device cpu --tokens 1,16,256 --hidden 4096 --gemm --repeats 30 \
  --json bench/results/cpu_ops.json
# One SP boundary on a 2-rank gloo world: fused vs replicated vs separate ops.
$BENCH layer --device cpu --tp 2 --tokens 16,256,4096 --hidden 4096 --repeats 10 \
  --json bench/results/cpu_layer.json
