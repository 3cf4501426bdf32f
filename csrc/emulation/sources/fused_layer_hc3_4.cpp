// SPDX-License-Identifier: Apache-2.0
// csrc/transport/symm/fused_layer_hc3_4.cu compiled for the emulated device (the same source).
#include "transport/symm/fused_layer_hc3_4.cu"
