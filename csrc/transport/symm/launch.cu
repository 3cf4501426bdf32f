// SPDX-License-Identifier: Apache-2.0
// Production launchers of the symm kernels (transport/symm/device/): this process's rank only,
// gridDim.y = 1, every hc_mult instantiated. Everything is enqueued on the given stream; the only
// allocation is the pre's split-K workspace, from the caching allocator; no host synchronisation,
// so the calls are CUDA-graph capturable.

#include "transport/symm/launch.cuh"

namespace mhc_sp::cuda {

// ---- the kernels: one rank's bodies (transport/symm/device/) ------------------------------------

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

__global__ void __launch_bounds__(kCopyThreads, kCopyMinBlocks)
    symm_lamport_sum_kernel(const __grid_constant__ LamportSumParams P) {
  lamport_sum(P);
}

template <boundary::Op kOp>
__global__ void __launch_bounds__(kCopyThreads, kCopyMinBlocks)
    symm_reduce_kernel(const __grid_constant__ CollectiveParams P) {
  exchange_reduce<kOp>(P);
}

__global__ void __launch_bounds__(kCopyThreads, kCopyMinBlocks)
    symm_gather_kernel(const __grid_constant__ CollectiveParams P) {
  exchange_gather(P);
}

}  // namespace mhc_sp::cuda

namespace mhc_sp::symm {

// ---- launchers ----------------------------------------------------------------------------------

using cuda::kCopyThreads;
using cuda::kFinishThreads;
using cuda::kProjThreads;

void launch_fused_layer(const RankView& rank, const LayerArgs& a, const LayerOutputs& out,
                        cudaStream_t stream) {
  dispatch_hc_mult(a.in.shape.n, [&](auto n_const) {
    constexpr int N = decltype(n_const)::value;
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
    cuda::launch_kernel(project, cuda::resident_grid(project, kProjThreads, plan.items, 1), 1,
                        kProjThreads, stream, {}, P);
    // The finish is a programmatic dependent of the projection (it waits for it on the device).
    cuda::launch_kernel(
        finish, cuda::resident_grid(finish, kFinishThreads, cuda::finish_groups(a.in.shape.T), 1),
        1, kFinishThreads, stream, {.dependent = true}, P);
  });
}

void launch_collective(const RankView& rank, boundary::Op op, const Tensor& out, const Tensor& in,
                       int64_t num_tokens, bool lamport, cudaStream_t stream) {
  if (lamport) {
    TORCH_CHECK(op == boundary::Op::kAllReduce, "mhc_sp: only all_reduce uses the Lamport mailbox");
    const cuda::LamportSumParams P = cuda::lamport_sum_params(rank, out, in);
    auto kernel = cuda::symm_lamport_sum_kernel;
    cuda::launch_kernel(kernel,
                        cuda::resident_grid(kernel, kCopyThreads, cuda::lamport_sum_items(in), 1),
                        1, kCopyThreads, stream, {}, P);
    return;
  }
  const cuda::CollectiveParams P = cuda::collective_params(rank, op, out, in, num_tokens);
  const int64_t items = cuda::collective_items(P, op);
  auto go = [&](auto kernel) {
    cuda::launch_kernel(kernel, cuda::resident_grid(kernel, kCopyThreads, items, 1), 1,
                        kCopyThreads, stream, {}, P);
  };
  switch (op) {
    case boundary::Op::kAllReduce: go(cuda::symm_reduce_kernel<boundary::Op::kAllReduce>); break;
    case boundary::Op::kReduceScatter:
      go(cuda::symm_reduce_kernel<boundary::Op::kReduceScatter>);
      break;
    case boundary::Op::kAllGather: go(cuda::symm_gather_kernel); break;
    default: TORCH_CHECK(false, "mhc_sp: not a symm collective: op ", static_cast<int>(op));
  }
}

}  // namespace mhc_sp::symm
