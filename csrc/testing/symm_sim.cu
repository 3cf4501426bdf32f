// SPDX-License-Identifier: Apache-2.0
// The harness's multi-rank kernels: each runs the production kernel's body (transport/symm/device/)
// for simulated rank blockIdx.y, so that one cooperative launch on one GPU runs a whole group
// through the same code a multi-GPU group runs. hc_mult 4 (V4's) only. No programmatic dependent
// launch: the finish follows the projection in stream order.

#include "testing/symm_sim.h"
#include "transport/symm/kernel_params.cuh"

namespace mhc_sp::testing {
namespace {

using cuda::CollectiveParams;
using cuda::kCopyMinBlocks;
using cuda::kCopyThreads;
using cuda::kFinishThreads;
using cuda::kProjThreads;
using cuda::kSymmProjMinBlocks;
using cuda::LamportLayerParams;
using cuda::LamportSumParams;
using cuda::ShardedLayerParams;

constexpr int N = 4;
constexpr int V = 8;

// Every simulated rank's parameters; rank `absent` (-1: none) never arrives.
template <class Params>
struct SimParams {
  Params r[kMaxSimRanks];
  int absent;
};

template <class Params>
__device__ __forceinline__ bool absent(const SimParams<Params>& P) {
  return static_cast<int>(blockIdx.y) == P.absent;
}

__global__ void __launch_bounds__(kProjThreads, kSymmProjMinBlocks)
    sim_lamport_layer_kernel(const __grid_constant__ SimParams<LamportLayerParams> P) {
  if (!absent(P)) cuda::lamport_layer<N, V>(P.r[blockIdx.y]);
}

__global__ void __launch_bounds__(kProjThreads, kSymmProjMinBlocks)
    sim_sharded_layer_kernel(const __grid_constant__ SimParams<ShardedLayerParams> P) {
  if (!absent(P)) cuda::sharded_layer_project<N, V>(P.r[blockIdx.y]);
}

__global__ void __launch_bounds__(kFinishThreads)
    sim_sharded_finish_kernel(const __grid_constant__ SimParams<ShardedLayerParams> P) {
  if (!absent(P)) cuda::sharded_layer_finish<N, V>(P.r[blockIdx.y]);
}

__global__ void __launch_bounds__(kCopyThreads, kCopyMinBlocks)
    sim_lamport_sum_kernel(const __grid_constant__ SimParams<LamportSumParams> P) {
  if (!absent(P)) cuda::lamport_sum(P.r[blockIdx.y]);
}

template <boundary::Op kOp>
__global__ void __launch_bounds__(kCopyThreads, kCopyMinBlocks)
    sim_reduce_kernel(const __grid_constant__ SimParams<CollectiveParams> P) {
  if (!absent(P)) cuda::exchange_reduce<kOp>(P.r[blockIdx.y]);
}

__global__ void __launch_bounds__(kCopyThreads, kCopyMinBlocks)
    sim_gather_kernel(const __grid_constant__ SimParams<CollectiveParams> P) {
  if (!absent(P)) cuda::exchange_gather(P.r[blockIdx.y]);
}

// A cooperative launch of `kernel` over every simulated rank.
template <typename Kernel, typename Params>
void launch_ranks(Kernel kernel, int threads, int64_t items, const SimParams<Params>& P,
                  int64_t ranks, cudaStream_t stream) {
  const int64_t grid = cuda::resident_grid(kernel, threads, items, ranks);
  cuda::launch_kernel(kernel, grid, ranks, threads, stream, {.cooperative = true}, P);
}

}  // namespace

void sim_launch_fused_layer(const std::vector<RankView>& ranks, const std::vector<LayerArgs>& calls,
                            const std::vector<LayerOutputs>& outs, int absent,
                            cudaStream_t stream) {
  const int64_t R = static_cast<int64_t>(ranks.size());
  TORCH_CHECK(R >= 1 && R <= kMaxSimRanks, "mhc_sp: 1 to ", kMaxSimRanks, " simulated ranks, got ",
              R);
  TORCH_CHECK(calls[0].in.shape.n == N, "mhc_sp: the symm harness simulates hc_mult 4 only");
  cuda::PrePlan plan{};
  std::vector<cuda::PreWorkspace> ws;
  ws.reserve(R);
  // Every simulated rank's parameters, made by `params` (lamport_layer_params or
  // sharded_layer_params), and its pre's split-K workspace.
  auto fill = [&](auto& P, auto params) {
    P.absent = absent;
    for (int64_t i = 0; i < R; ++i) {
      P.r[i] = params(ranks[i], calls[i], outs[i], plan);
      ws.emplace_back(P.r[i].pre, plan);
    }
  };
  if (!calls[0].sharded) {
    SimParams<LamportLayerParams> P{};
    fill(P, cuda::lamport_layer_params<N>);
    launch_ranks(sim_lamport_layer_kernel, kProjThreads, plan.items, P, R, stream);
    return;
  }
  SimParams<ShardedLayerParams> P{};
  fill(P, cuda::sharded_layer_params<N>);
  launch_ranks(sim_sharded_layer_kernel, kProjThreads, plan.items, P, R, stream);
  launch_ranks(sim_sharded_finish_kernel, kFinishThreads, cuda::finish_groups(calls[0].in.shape.T),
               P, R, stream);
}

void sim_launch_collective(const std::vector<RankView>& ranks, boundary::Op op,
                           const std::vector<Tensor>& outs, const std::vector<Tensor>& ins,
                           int64_t num_tokens, bool lamport, int absent, cudaStream_t stream) {
  const int64_t R = static_cast<int64_t>(ranks.size());
  TORCH_CHECK(R >= 1 && R <= kMaxSimRanks, "mhc_sp: 1 to ", kMaxSimRanks, " simulated ranks, got ",
              R);
  if (lamport) {
    SimParams<LamportSumParams> P{};
    P.absent = absent;
    for (int64_t i = 0; i < R; ++i) P.r[i] = cuda::lamport_sum_params(ranks[i], outs[i], ins[i]);
    launch_ranks(sim_lamport_sum_kernel, kCopyThreads, cuda::lamport_sum_items(ins[0]), P, R,
                 stream);
    return;
  }
  SimParams<CollectiveParams> P{};
  P.absent = absent;
  for (int64_t i = 0; i < R; ++i) {
    P.r[i] = cuda::collective_params(ranks[i], op, outs[i], ins[i], num_tokens);
  }
  const int64_t items = cuda::collective_items(P.r[0], op);
  switch (op) {
    case boundary::Op::kAllReduce:
      launch_ranks(sim_reduce_kernel<boundary::Op::kAllReduce>, kCopyThreads, items, P, R, stream);
      break;
    case boundary::Op::kReduceScatter:
      launch_ranks(sim_reduce_kernel<boundary::Op::kReduceScatter>, kCopyThreads, items, P, R,
                   stream);
      break;
    case boundary::Op::kAllGather:
      launch_ranks(sim_gather_kernel, kCopyThreads, items, P, R, stream);
      break;
    default: TORCH_CHECK(false, "mhc_sp: not a symm collective: op ", static_cast<int>(op));
  }
}

}  // namespace mhc_sp::testing
