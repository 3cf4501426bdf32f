// SPDX-License-Identifier: Apache-2.0
// fused_layer's symm kernels and launchers for hc_mult 3 and 4 (transport/symm/fused_layer.cuh).

#include "transport/symm/fused_layer.cuh"

namespace mhc_sp::symm {

template void launch_fused_layer_n<3>(const RankView&, const LayerArgs&, const LayerOutputs&,
                                      cudaStream_t);
template void launch_fused_layer_n<4>(const RankView&, const LayerArgs&, const LayerOutputs&,
                                      cudaStream_t);

}  // namespace mhc_sp::symm
