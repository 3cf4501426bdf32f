// SPDX-License-Identifier: Apache-2.0
// fused_layer's symm kernels and launchers for hc_mult 1 and 2 (transport/symm/fused_layer.cuh).

#include "transport/symm/fused_layer.cuh"

namespace mhc_sp::symm {

template void launch_fused_layer_n<1>(const RankView&, const LayerArgs&, const LayerOutputs&,
                                      cudaStream_t);
template void launch_fused_layer_n<2>(const RankView&, const LayerArgs&, const LayerOutputs&,
                                      cudaStream_t);

}  // namespace mhc_sp::symm
