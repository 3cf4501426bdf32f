// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host entry points of the symm kernels (transport/symm/collective_launch.cu), callable from plain
// C++: each launches one rank's kernels (this process's) on `stream`, without synchronising with
// the host, so the calls are CUDA-graph capturable. The communicator checks that a call fits the
// workspace (layout.h: reduction_path, exchange_path, collective_path) before it launches.

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include "mhc_sp/comm.h"
#include "transport/symm/layout.h"

namespace mhc_sp::symm {

// The kernels move 16-byte vectors: a tensor whose data is not 16-byte aligned is copied (which
// path a call takes never depends on addresses, which may differ between ranks, only on shapes).
inline bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

inline Tensor aligned(const Tensor& t) {
  return t.is_contiguous() && aligned16(t) ? t : t.clone(at::MemoryFormat::Contiguous);
}

// The call `a` with its partial and stream 16-byte aligned (copies where they are not).
inline LayerArgs aligned_layer_args(const LayerArgs& a) {
  return LayerArgs{aligned(a.partial),
                   PostInputs{aligned(a.in.residual), a.in.post, a.in.comb, a.in.shape}, a.pre,
                   a.sharded, a.num_tokens};
}

// The outputs fused_layer writes on this rank: residual_out, post, comb of its stream rows, and
// layer_input (the gathered (num_tokens, H) when sharded).
inline LayerOutputs layer_outputs(const LayerArgs& a) {
  const StreamShape& s = a.in.shape;
  const auto opts = a.in.residual.options();
  return {at::empty({s.T, s.n, s.H}, opts), at::empty({s.T, s.n}, opts.dtype(at::kFloat)),
          at::empty({s.T, s.n, s.n}, opts.dtype(at::kFloat)),
          at::empty({a.sharded ? a.num_tokens : s.T, s.H}, opts)};
}

// fused_layer on this rank, `a` 16-byte aligned (aligned_layer_args), into `out`. Replicated: the
// one-kernel boundary through the Lamport mailbox (reduction_path must say kLamport); sharded: two
// kernels over a half, the second a programmatic dependent of the first (exchange_path: kExchange).
void launch_fused_layer(const RankView& rank, const LayerArgs& a, const LayerOutputs& out,
                        cudaStream_t stream);
// launch_fused_layer for hc_mult N (transport/symm/fused_layer.cuh, fused_layer_hc*.cu).
template <int N>
void launch_fused_layer_n(const RankView& rank, const LayerArgs& a, const LayerOutputs& out,
                          cudaStream_t stream);

// A plain collective on this rank (collective_path must not say kFallback): all_reduce through the
// mailbox (`lamport`) or the barrier exchange, reduce_scatter, all_gather (num_tokens: rows of the
// concatenation kept, -1 for all). `in` and `out` contiguous and 16-byte aligned.
void launch_collective(const RankView& rank, boundary::Op op, const Tensor& out, const Tensor& in,
                       int64_t num_tokens, bool lamport, cudaStream_t stream);

}  // namespace mhc_sp::symm
