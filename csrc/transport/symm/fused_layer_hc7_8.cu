// SPDX-License-Identifier: Apache-2.0
// fused_layer's symm kernels and launchers for hc_mult 7 and 8 (transport/symm/fused_layer.cuh).
#include "transport/symm/fused_layer.cuh"
MHC_SP_FUSED_LAYER_INSTANCES(7, 8)
