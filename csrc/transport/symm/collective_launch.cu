// SPDX-License-Identifier: Apache-2.0
// Production launchers of the symm kernels (transport/symm/device/): this process's rank only,
// gridDim.y = 1. The collectives are here; fused_layer's kernels, instantiated for every hc_mult,
// are in fused_layer_hc*.cu (transport/symm/fused_layer.cuh), two hc_mults per translation unit so
// that no unit dominates a parallel build. Everything is enqueued on the given stream; the only
// allocation is the pre's split-K workspace, from the caching allocator; no host synchronisation,
// so the calls are CUDA-graph capturable.

#include "transport/symm/kernel_params.cuh"

namespace mhc_sp::cuda {

// ---- the kernels: one rank's bodies (transport/symm/device/) ------------------------------------

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

void launch_fused_layer(const RankView& rank, const LayerArgs& a, const LayerOutputs& out,
                        cudaStream_t stream) {
  dispatch_hc_mult(a.in.shape.n, [&](auto n_const) {
    launch_fused_layer_n<decltype(n_const)::value>(rank, a, out, stream);
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
  cuda::CollectiveParams P = cuda::collective_params(rank, op, out, in, num_tokens);
  const int64_t items = cuda::collective_items(P, op);
  auto go = [&](auto kernel) {
    const int64_t grid = cuda::resident_grid(kernel, kCopyThreads, items, 1);
    cuda::set_plan(P.e.header, grid, 0, 0);
    cuda::launch_kernel(kernel, grid, 1, kCopyThreads, stream, {}, P);
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
