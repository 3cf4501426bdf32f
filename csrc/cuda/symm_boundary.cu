// SPDX-License-Identifier: Apache-2.0
// Launchers of the symmetric-memory kernels (mhc_sp/cuda/symm.cuh) for production (one rank,
// gridDim.y = 1) and the single-GPU harness (every simulated rank in one cooperative launch).
// Everything is enqueued on the given stream; the only allocation is the pre's split-K workspace,
// from the caching allocator; no host synchronisation, so the calls are CUDA-graph capturable.

#include "mhc_sp/cuda/launch.cuh"
#include "mhc_sp/cuda/symm.cuh"
#include "mhc_sp/cuda/symm_launch.h"

namespace mhc_sp::cuda {
namespace {

using symm::CollectiveCall;
using symm::LayerCall;
using symm::RankHandles;

constexpr int kSimRanks = symm::kMaxSimRanks;

SymmRank device_rank(const RankHandles& h) {
  return SymmRank{h.peers, h.rank, h.world, h.state, h.error, h.timeout_ns, h.L, h.absent};
}

// Blocks of `kernel` that fit on the GPU at once, shared among `ranks` simulated ranks, and never
// more than the barrier slots. Every rank computes the same number from the same call (the
// group's GPUs are one model), which the per-block barriers rely on.
template <typename Kernel>
int64_t resident_grid(Kernel kernel, int threads, int64_t items, int64_t ranks) {
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  TORCH_CHECK(per_sm >= 1, "mhc_sp: a symm kernel does not fit on this GPU");
  const int64_t cap = std::min<int64_t>(int64_t(per_sm) * sm_count() / ranks, symm::kMaxBlocks);
  TORCH_CHECK(cap >= 1, "mhc_sp: ", ranks, " simulated ranks do not fit on this GPU at once");
  return std::max<int64_t>(1, std::min(items, cap));
}

// One launch of `kernel` over grid x ranks blocks. simulated: cooperative (all blocks resident or
// the launch fails); pdl: a programmatic dependent of the previous kernel in the stream.
template <typename Kernel, typename Params>
void launch(Kernel kernel, int64_t grid, int64_t ranks, int threads, const Params& params,
            bool simulated, bool pdl, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid), static_cast<unsigned>(ranks), 1);
  cfg.blockDim = dim3(threads, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (simulated) {
    attrs[n].id = cudaLaunchAttributeCooperative;
    attrs[n].val.cooperative = 1;
    ++n;
  }
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, params));
}

PreArgs layer_pre_args(const LayerCall& c) {
  PreArgs a = pre_args(c.pre);
  a.src = bits(c.post.residual);
  a.x = nullptr;
  a.post_in = c.post.post;
  a.comb_in = c.post.comb;
  a.stream_out = bits(c.post.residual_out);
  return a;
}

// The split-K workspace of one rank's pre (released to the caching allocator, stream-ordered).
struct PreWorkspace {
  c10::DataPtr data;
  PreWorkspace(PreArgs& a, const PrePlan& plan) {
    data = c10::cuda::CUDACachingAllocator::get()->allocate(
        static_cast<size_t>(plan.ws_floats * sizeof(float)));
    a.ws = static_cast<float*>(data.get());
    a.splits = static_cast<int>(plan.splits);
    a.chunks_per_split = static_cast<int>(plan.per_split);
  }
};

template <int N, int R>
void lamport_layer(const std::vector<LayerCall>& ranks, bool simulated, cudaStream_t stream) {
  const int64_t T = ranks[0].post.T, H = ranks[0].post.H;
  const PrePlan plan = plan_pre<N, Mode::PostPre>(T, H, sm_count());
  TORCH_CHECK(plan.fused && plan.tiles == 1, "mhc_sp: the Lamport boundary takes at most ",
              kFusedMaxTokens, " tokens");
  LamportLayerParams<R> P{};
  std::vector<PreWorkspace> ws;
  ws.reserve(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    const LayerCall& c = ranks[i];
    LamportLayerRank& r = P.r[i];
    r.s = device_rank(c.h);
    r.pre = layer_pre_args(c);
    ws.emplace_back(r.pre, plan);
    r.pre.counters = reinterpret_cast<int*>(&c.h.state->tile_counter);  // resets itself
    r.partial = bits(c.partial);
    r.items = plan.items;
  }
  auto kernel = symm_lamport_layer_kernel<N, 8, R>;
  const int64_t sims = static_cast<int64_t>(ranks.size());
  const int64_t grid = resident_grid(kernel, kProjThreads, plan.items, sims);
  launch(kernel, grid, sims, kProjThreads, P, simulated, false, stream);
}

template <int N, int R>
void sharded_layer(const std::vector<LayerCall>& ranks, bool simulated, cudaStream_t stream) {
  const int64_t shard = ranks[0].post.T, H = ranks[0].post.H;
  const PrePlan plan = plan_pre<N, Mode::PostPre>(shard, H, sm_count());
  ShardedLayerParams<R> P{};
  std::vector<PreWorkspace> ws;
  ws.reserve(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    const LayerCall& c = ranks[i];
    ShardedLayerRank& r = P.r[i];
    ExchangeRank& e = r.e;
    e.s = device_rank(c.h);
    e.header = CallHeader{};
    e.header.op = static_cast<uint32_t>(boundary::Op::kFusedLayer);
    e.header.flags = boundary::kSharded;
    e.header.rows = c.num_tokens;
    e.header.num_tokens = c.num_tokens;
    e.header.inner = H;
    e.header.dtype = static_cast<uint32_t>(c10::ScalarType::BFloat16);
    e.header.elem_bytes = 2;
    e.X = symm::exchange_layout(e.header, c.h.world);
    e.rows = c.num_tokens;
    e.valid = symm::shard_valid_rows(c.num_tokens, c.h.world, c.h.rank);
    r.pre = layer_pre_args(c);
    ws.emplace_back(r.pre, plan);
    r.pre.counters = nullptr;
    r.partial = bits(c.partial);
    r.gathered = bits(c.gathered);
    r.items = plan.items;
  }
  const int64_t sims = static_cast<int64_t>(ranks.size());
  auto project = symm_sharded_layer_kernel<N, 8, R>;
  auto finish = symm_sharded_finish_kernel<N, 8, R>;
  const int64_t groups = (shard + kFinishTokens - 1) / kFinishTokens;
  launch(project, resident_grid(project, kProjThreads, plan.items, sims), sims, kProjThreads, P,
         simulated, false, stream);
  launch(finish, resident_grid(finish, kFinishThreads, groups, sims), sims, kFinishThreads, P,
         simulated, !simulated, stream);
}

template <int R>
void collective(const std::vector<CollectiveCall>& ranks, bool lamport, bool simulated,
                cudaStream_t stream) {
  const int64_t sims = static_cast<int64_t>(ranks.size());
  const CollectiveCall& c0 = ranks[0];
  if (lamport) {
    LamportSumParams<R> P{};
    for (size_t i = 0; i < ranks.size(); ++i) {
      const CollectiveCall& c = ranks[i];
      P.r[i] = LamportSumRank{device_rank(c.h), static_cast<const uint16_t*>(c.in),
                              static_cast<uint16_t*>(c.out), c.rows * c.row_bytes / 2};
    }
    auto kernel = symm_lamport_sum_kernel<R>;
    const int64_t items = (c0.rows * c0.row_bytes + kSpanBytes - 1) / kSpanBytes;
    launch(kernel, resident_grid(kernel, kCopyThreads, items, sims), sims, kCopyThreads, P,
           simulated, false, stream);
    return;
  }
  CollectiveParams<R> P{};
  for (size_t i = 0; i < ranks.size(); ++i) {
    const CollectiveCall& c = ranks[i];
    CollectiveRank& r = P.r[i];
    ExchangeRank& e = r.e;
    e.s = device_rank(c.h);
    e.header = CallHeader{};
    e.header.op = static_cast<uint32_t>(c.op);
    e.header.rows = c.rows;
    e.header.num_tokens = c.op == boundary::Op::kAllGather ? c.num_tokens : -1;
    e.header.inner = c.row_bytes;
    e.header.dtype = 0;  // bytes (the caller checked the dtype)
    e.header.elem_bytes = 1;
    e.X = symm::exchange_layout(e.header, c.h.world);
    e.rows = c.rows;
    e.valid = c.op == boundary::Op::kAllGather
                  ? c.rows
                  : symm::shard_valid_rows(c.rows, c.h.world, c.h.rank);
    r.in = static_cast<const uint8_t*>(c.in);
    r.out = static_cast<uint8_t*>(c.out);
    const int64_t out_rows = c.op == boundary::Op::kReduceScatter ? e.X.in_rows
                             : c.op == boundary::Op::kAllReduce
                                 ? c.rows
                                 : (c.num_tokens < 0 ? c.rows * c.h.world : c.num_tokens);
    r.out_bytes = out_rows * c.row_bytes;
  }
  const ExchangeLayout& X = P.r[0].e.X;
  const int64_t spans = (X.row_bytes + kSpanBytes - 1) / kSpanBytes;
  auto go = [&](auto kernel, int64_t rows) {
    launch(kernel, resident_grid(kernel, kCopyThreads, rows * spans, sims), sims, kCopyThreads, P,
           simulated, false, stream);
  };
  switch (c0.op) {
    case boundary::Op::kAllReduce:
      go(symm_reduce_kernel<boundary::Op::kAllReduce, R>, X.in_rows);
      break;
    case boundary::Op::kReduceScatter:
      go(symm_reduce_kernel<boundary::Op::kReduceScatter, R>, X.in_rows);
      break;
    case boundary::Op::kAllGather: go(symm_gather_kernel<R>, X.out_rows); break;
    default: TORCH_CHECK(false, "mhc_sp: not a symm collective: op ", static_cast<int>(c0.op));
  }
}

void check_ranks(size_t ranks, bool simulated) {
  TORCH_CHECK(ranks >= 1 && (simulated ? ranks <= size_t(kSimRanks) : ranks == 1),
              "mhc_sp: a symm launch runs one rank, or up to ", kSimRanks, " simulated ones; got ",
              ranks);
}

}  // namespace
}  // namespace mhc_sp::cuda

namespace mhc_sp::symm {

// Production instantiates every hc_mult for one rank; the harness simulates V4 (n = 4) only.
void launch_lamport_layer(const std::vector<LayerCall>& ranks, bool simulated,
                          cudaStream_t stream) {
  cuda::check_ranks(ranks.size(), simulated);
  if (simulated) {
    TORCH_CHECK(ranks[0].post.n == 4, "mhc_sp: the symm harness simulates hc_mult 4 only");
    return cuda::lamport_layer<4, cuda::kSimRanks>(ranks, true, stream);
  }
  dispatch_hc_mult(ranks[0].post.n, [&](auto n_const) {
    cuda::lamport_layer<decltype(n_const)::value, 1>(ranks, false, stream);
  });
}

void launch_sharded_layer(const std::vector<LayerCall>& ranks, bool simulated,
                          cudaStream_t stream) {
  cuda::check_ranks(ranks.size(), simulated);
  if (simulated) {
    TORCH_CHECK(ranks[0].post.n == 4, "mhc_sp: the symm harness simulates hc_mult 4 only");
    return cuda::sharded_layer<4, cuda::kSimRanks>(ranks, true, stream);
  }
  dispatch_hc_mult(ranks[0].post.n, [&](auto n_const) {
    cuda::sharded_layer<decltype(n_const)::value, 1>(ranks, false, stream);
  });
}

void launch_collective(const std::vector<CollectiveCall>& ranks, bool lamport, bool simulated,
                       cudaStream_t stream) {
  cuda::check_ranks(ranks.size(), simulated);
  if (simulated) return cuda::collective<cuda::kSimRanks>(ranks, lamport, true, stream);
  cuda::collective<1>(ranks, lamport, false, stream);
}

}  // namespace mhc_sp::symm
