// SPDX-License-Identifier: Apache-2.0
// csrc/cuda/hc_head.cu compiled for the emulated device (the same source, not a copy).
#include "cuda/hc_head.cu"
