// SPDX-License-Identifier: Apache-2.0
// csrc/testing/symm_sim.cu (the harness's multi-rank kernels) compiled for the emulated device
// (the same source, not a copy).
#include "testing/symm_sim.cu"
