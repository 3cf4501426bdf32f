// SPDX-License-Identifier: Apache-2.0
// csrc/cuda/mhc_pre.cu compiled for the emulated device (the same source, not a copy).
#include "cuda/mhc_pre.cu"
