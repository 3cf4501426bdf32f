#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The CPU results recorded in bench/results/ and the plots in docs/img/ (docs/benchmarks.md quotes
# them). mhc-sp-bench applies the allocator setting itself and prints which allocator it used;
# times are medians of interleaved rounds, so a busy machine widens the intervals rather than
# tilting the comparisons (the busy-machine warning, when printed, is part of the record).
# Run: bash bench/cpu_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=.venv/bin/mhc-sp-bench
R=bench/results
mkdir -p "$R" docs/img
# The main job: from how many tokens SP pays off here (tp 2, V4-Flash's hidden size).
$BENCH tune -tp 2 --hidden-size 4096 --json $R/cpu_tune.json
# The same question five times each at hidden sizes 1024 and 4096 on 2 and 3 ranks, and the
# bare command five times: the recommendation must hold still (one record per command,
# bench/results/cpu_stability_*.json; `... table` prints the docs' table of them).
bash bench/tune_stability.sh all
bash bench/tune_stability.sh table
# One SP boundary on 2 ranks of one thread each: fused vs replicated vs separate ops, over shared
# memory and over gloo in the same run.
$BENCH layer --device cpu -tp 2 --tokens 2,4,8,16,32,64,128,256,512,1024,2048,4096 \
  --hidden-size 4096 --threads 1 --transport shm,gloo --json $R/cpu_layer.json
# The same boundary with glibc's default allocator (the value given is glibc's own default, so
# mhc-sp-bench leaves it as it is): what the allocator setting is worth at prefill sizes.
GLIBC_TUNABLES=glibc.malloc.mmap_max=65536 $BENCH layer --device cpu -tp 2 --tokens 16,2048 \
  --hidden-size 4096 --threads 1 --json $R/cpu_layer_default_malloc.json
# Math ops at decode and prefill sizes on one thread, against one fp32 GEMM, the eager and the
# compiled reference.
$BENCH ops --device cpu --threads 1 --tokens 1,16,256 --hidden-size 4096 --gemm --repeats 60 \
  --json $R/cpu_ops.json
# The plots in docs/, drawn from the recorded files.
$BENCH show $R/cpu_tune.json --plot docs/img/cpu_tune.png
$BENCH show $R/cpu_layer.json --plot docs/img/cpu_layer.png
