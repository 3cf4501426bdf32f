// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a launch of the symm kernels needs on the host, shared by the production launchers
// (transport/symm/collective_launch.cu: one rank) and the testing module (csrc/testing/: several
// simulated ranks in one cooperative launch): one rank's kernel parameters built from a checked
// call, the pre's split-K workspace, the resident grid and the launch itself. Included only from
// .cu files.

#include <c10/cuda/CUDACachingAllocator.h>

#include "cuda/math_launch.cuh"
#include "mhc_sp/detail/params.h"
#include "transport/symm/device/collective_kernels.cuh"
#include "transport/symm/device/layer_kernels.cuh"
#include "transport/symm/kernels.h"

namespace mhc_sp::cuda {

using symm::RankView;

// Blocks of `kernel` that fit on the GPU at once, shared among `ranks` simulated ranks (1 in
// production), and never more than the barrier slots. Every rank computes the same number from
// the same call (the group's GPUs are one model), which the per-block barriers rely on.
template <typename Kernel>
int64_t resident_grid(Kernel kernel, int threads, int64_t items, int64_t ranks) {
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  TORCH_CHECK(per_sm >= 1, "mhc_sp: a symm kernel does not fit on this GPU");
  const int64_t cap = std::min<int64_t>(int64_t(per_sm) * sm_count() / ranks, symm::kMaxBlocks);
  TORCH_CHECK(cap >= 1, "mhc_sp: ", ranks, " simulated ranks do not fit on this GPU at once");
  return std::max<int64_t>(1, std::min(items, cap));
}

// The split-K workspace of one rank's pre (released to the caching allocator, stream-ordered).
struct PreWorkspace {
  c10::DataPtr data;
  PreWorkspace(PreArgs& a, const PrePlan& plan) {
    data = c10::cuda::CUDACachingAllocator::get()->allocate(
        static_cast<size_t>(plan.ws_floats * sizeof(float)));
    a.ws = static_cast<float*>(data.get());
    use_plan(a, plan);
  }
};

// The post + pre of fused_layer over this rank's stream rows: x unused (the kernels reduce it
// from the peers' rows), layer_input (replicated) or nothing (sharded: the gathered rows are
// written by the finish).
inline PreArgs layer_pre_args(const LayerArgs& a, const LayerOutputs& out, BFloat16* layer_input) {
  const StreamShape& s = a.in.shape;
  const auto& [residual_out, post_out, comb_out, unused] = out;
  PreArgs p = pre_args(pre_kernel_params(a.pre, s.T, s, post_out.data_ptr<float>(),
                                         comb_out.data_ptr<float>(), layer_input));
  p.src = bits(a.in.residual.const_data_ptr<BFloat16>());
  p.x = nullptr;
  p.post_in = a.in.post.const_data_ptr<float>();
  p.comb_in = a.in.comb.const_data_ptr<float>();
  p.stream_out = bits(residual_out.data_ptr<BFloat16>());
  return p;
}

// The replicated boundary's parameters on one rank, and its plan (one fused token tile).
template <int N>
LamportLayerParams lamport_layer_params(const RankView& rank, const LayerArgs& a,
                                        const LayerOutputs& out, PrePlan& plan) {
  const StreamShape& s = a.in.shape;
  plan = plan_pre<N, Mode::PostPre>(s.T, s.H, sm_count());
  TORCH_CHECK(plan.fused && plan.tiles == 1, "mhc_sp: the Lamport boundary takes at most ",
              symm::kLamportMaxTokens, " tokens, got ", s.T);
  LamportLayerParams P{};
  P.s = rank;
  P.pre = layer_pre_args(a, out, std::get<3>(out).data_ptr<BFloat16>());
  P.pre.counters = reinterpret_cast<int*>(&rank.state->tile_counter);  // resets itself
  P.partial = bits(a.partial.const_data_ptr<BFloat16>());
  P.items = plan.items;
  return P;
}

// This rank's part of a barrier-exchanged call.
inline ExchangeView exchange_view(const RankView& rank, boundary::Op op, uint32_t flags,
                                  int64_t rows, int64_t num_tokens, int64_t inner, uint32_t dtype,
                                  uint32_t elem_bytes, int64_t valid) {
  ExchangeView e{};
  e.s = rank;
  e.header = CallHeader{};
  e.header.op = static_cast<uint32_t>(op);
  e.header.flags = flags;
  e.header.rows = rows;
  e.header.num_tokens = num_tokens;
  e.header.inner = inner;
  e.header.dtype = dtype;
  e.header.elem_bytes = elem_bytes;
  e.X = symm::exchange_layout(e.header, rank.world, rank.L.half_bytes);
  e.rows = rows;
  e.valid = valid;
  return e;
}

// The launch plan in a barrier-exchanged call's header (checked by every peer, rule 4): the
// grids of its kernels and the pre's chunks per split.
inline void set_plan(CallHeader& h, int64_t blocks, int64_t finish_blocks,
                     int64_t chunks_per_split) {
  h.blocks = static_cast<uint32_t>(blocks);
  h.finish_blocks = static_cast<uint32_t>(finish_blocks);
  h.chunks_per_split = static_cast<uint32_t>(chunks_per_split);
}

// The sharded boundary's parameters on one rank, and its plan over the shard.
template <int N>
ShardedLayerParams sharded_layer_params(const RankView& rank, const LayerArgs& a,
                                        const LayerOutputs& out, PrePlan& plan) {
  const StreamShape& s = a.in.shape;
  plan = plan_pre<N, Mode::PostPre>(s.T, s.H, sm_count());
  ShardedLayerParams P{};
  P.e = exchange_view(rank, boundary::Op::kFusedLayer, boundary::kSharded, a.num_tokens,
                      a.num_tokens, s.H, static_cast<uint32_t>(c10::ScalarType::BFloat16), 2,
                      symm::shard_valid_rows(a.num_tokens, rank.world, rank.rank));
  P.pre = layer_pre_args(a, out, nullptr);
  P.pre.counters = nullptr;
  P.partial = bits(a.partial.const_data_ptr<BFloat16>());
  P.gathered = bits(std::get<3>(out).data_ptr<BFloat16>());
  P.items = plan.items;
  return P;
}

// Finish-kernel work items of a sharded boundary over `shard` rows.
inline int64_t finish_groups(int64_t shard) { return (shard + kFinishTokens - 1) / kFinishTokens; }

// A plain collective over `in` (rows, ...) into `out`: its rows and row bytes.
struct CollectiveShape {
  int64_t rows, row_bytes;
};

inline CollectiveShape collective_shape(const Tensor& in) {
  const int64_t rows = in.size(0);
  return {rows, in.numel() / rows * static_cast<int64_t>(in.element_size())};
}

inline LamportSumParams lamport_sum_params(const RankView& rank, const Tensor& out,
                                           const Tensor& in) {
  return LamportSumParams{rank, static_cast<const uint16_t*>(in.const_data_ptr()),
                          static_cast<uint16_t*>(out.data_ptr()), in.numel()};
}

// Work items of the Lamport all-reduce: spans of kSpanBytes.
inline int64_t lamport_sum_items(const Tensor& in) {
  return (static_cast<int64_t>(in.nbytes()) + kSpanBytes - 1) / kSpanBytes;
}

inline CollectiveParams collective_params(const RankView& rank, boundary::Op op, const Tensor& out,
                                          const Tensor& in, int64_t num_tokens) {
  const CollectiveShape c = collective_shape(in);
  const bool gather = op == boundary::Op::kAllGather;
  CollectiveParams P{};
  // dtype 0: bytes (the caller checked the dtype); a gather's header keeps its num_tokens.
  P.e = exchange_view(rank, op, 0, c.rows, gather ? num_tokens : -1, c.row_bytes, 0, 1,
                      gather ? c.rows : symm::shard_valid_rows(c.rows, rank.world, rank.rank));
  P.in = static_cast<const uint8_t*>(in.const_data_ptr());
  P.out = static_cast<uint8_t*>(out.data_ptr());
  P.out_bytes = static_cast<int64_t>(out.nbytes());
  return P;
}

// Work items of a barrier-exchanged collective: its rows (a shard's for the reductions, all for
// the gather) times spans of kSpanBytes per row.
inline int64_t collective_items(const CollectiveParams& P, boundary::Op op) {
  const symm::ExchangeLayout& X = P.e.X;
  const int64_t spans = (X.row_bytes + kSpanBytes - 1) / kSpanBytes;
  return (op == boundary::Op::kAllGather ? X.out_rows : X.in_rows) * spans;
}

}  // namespace mhc_sp::cuda
