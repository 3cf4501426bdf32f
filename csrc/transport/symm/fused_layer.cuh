// SPDX-License-Identifier: Apache-2.0
#pragma once
// fused_layer's production kernels and launcher for one hc_mult
// (transport/symm/collective_launch.cu dispatches to them): this process's rank only, gridDim.y
// = 1. Explicitly instantiated in fused_layer_hc*.cu, two hc_mults per translation unit, so that a
// parallel build compiles them at once; collective_launch.cu only declares them.

#include "transport/symm/kernel_params.cuh"

namespace mhc_sp::cuda {

// ---- the kernels: one rank's bodies (transport/symm/device/layer_kernels.cuh) -------------------

template <int N, int V>
__global__ void __launch_bounds__(kProjThreads, kSymmProjMinBlocks)
    symm_lamport_layer_kernel(const __grid_constant__ LamportLayerParams P) {
  lamport_layer<N, V>(P);
}

template <int N, int V>
__global__ void __launch_bounds__(kProjThreads, kSymmProjMinBlocks)
    symm_sharded_layer_kernel(const __grid_constant__ ShardedLayerParams P) {
  sharded_layer_project<N, V>(P);
}

template <int N, int V>
__global__ void __launch_bounds__(kFinishThreads)
    symm_sharded_finish_kernel(const __grid_constant__ ShardedLayerParams P) {
  wait_for_prerequisite_grid();  // kernel A's partial sums, residual_out and epochs are complete
  sharded_layer_finish<N, V>(P);
}

}  // namespace mhc_sp::cuda

namespace mhc_sp::symm {

// fused_layer on this rank for hc_mult N (kernels.h: launch_fused_layer). Replicated: the
// one-kernel boundary through the Lamport mailbox; sharded: the projection over the exchange, then
// the finish as its programmatic dependent, both grids and the split in the call header (checked by
// every peer).
template <int N>
void launch_fused_layer_n(const RankView& rank, const LayerArgs& a, const LayerOutputs& out,
                          cudaStream_t stream) {
  using cuda::kFinishThreads;
  using cuda::kProjThreads;
  cuda::PrePlan plan{};
  if (!a.sharded) {
    cuda::LamportLayerParams P = cuda::lamport_layer_params<N>(rank, a, out, plan);
    const cuda::PreWorkspace ws(P.pre, plan);
    auto kernel = cuda::symm_lamport_layer_kernel<N, 8>;
    const int64_t grid = cuda::resident_grid(kernel, kProjThreads, plan.items, 1);
    cuda::launch_kernel(kernel, grid, 1, kProjThreads, stream, {}, P);
    return;
  }
  cuda::ShardedLayerParams P = cuda::sharded_layer_params<N>(rank, a, out, plan);
  const cuda::PreWorkspace ws(P.pre, plan);
  auto project = cuda::symm_sharded_layer_kernel<N, 8>;
  auto finish = cuda::symm_sharded_finish_kernel<N, 8>;
  const int64_t grid = cuda::resident_grid(project, kProjThreads, plan.items, 1);
  const int64_t finish_grid =
      cuda::resident_grid(finish, kFinishThreads, cuda::finish_groups(a.in.shape.T), 1);
  cuda::set_plan(P.e.header, grid, finish_grid, plan.per_split);
  cuda::launch_kernel(project, grid, 1, kProjThreads, stream, {}, P);
  // The finish is a programmatic dependent of the projection (it waits for it on the device).
  cuda::launch_kernel(finish, finish_grid, 1, kFinishThreads, stream, {.dependent = true}, P);
}

}  // namespace mhc_sp::symm

// The explicit instances of launch_fused_layer_n for two hc_mult values: each fused_layer_hc*.cu
// holds one pair, so that no translation unit of the build dominates it.
#define MHC_SP_FUSED_LAYER_INSTANCES(A, B)                                                      \
  namespace mhc_sp::symm {                                                                      \
  template void launch_fused_layer_n<A>(const RankView&, const LayerArgs&, const LayerOutputs&, \
                                        cudaStream_t);                                          \
  template void launch_fused_layer_n<B>(const RankView&, const LayerArgs&, const LayerOutputs&, \
                                        cudaStream_t);                                          \
  }
