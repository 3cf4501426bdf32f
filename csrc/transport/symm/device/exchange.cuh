// SPDX-License-Identifier: Apache-2.0
#pragma once
// The barrier exchange of the symm transport: a call's header and rows pushed into the owners'
// halves (push reduce-scatter), the header check at the first barrier, and the x source of the
// sharded boundary that sums the landed rows (layout: transport/symm/layout.h, exchange_layout).

#include <cuda_runtime.h>

#include "cuda/device/pre.cuh"
#include "transport/symm/device/sync.cuh"

namespace mhc_sp::cuda {

using symm::CallHeader;
using symm::ExchangeLayout;
using symm::RankView;

// One rank's part of a barrier-exchanged call (the half and layout of exchange_layout).
struct ExchangeView {
  RankView s;
  CallHeader header;  // this rank's header of the call (`call` filled in on the device)
  ExchangeLayout X;
  int64_t rows;   // rows of the caller's input (partial / x)
  int64_t valid;  // real rows of this rank's shard (shard_valid_rows)
};

// This rank's header of call `call`. Its epoch is 0: every block writes the header into the same
// slot, and each block has its own barrier epochs (the call number already tells calls apart).
__device__ __forceinline__ CallHeader header_of_call(const ExchangeView& E, uint64_t call) {
  CallHeader h = E.header;
  h.call = call;
  h.epoch = 0;
  return h;
}

// Every block writes this rank's header into headers[rank] of every peer's half (thread p to rank
// p; the same bytes from every block, as relaxed 16-byte stores: concurrent writers of one value
// are no data race), so that each block's own barrier orders it before the peer's check.
__device__ __forceinline__ void push_header(const ExchangeView& E, const CallHeader& h,
                                            uint64_t call) {
  if (threadIdx.x >= E.s.world) return;
  auto* dst = reinterpret_cast<uint4*>(half_base(E.s, E.s.peers[threadIdx.x], call) +
                                       symm::header_offset(E.s.rank));
  const auto* src = reinterpret_cast<const uint4*>(&h);
#pragma unroll
  for (int k = 0; k < symm::kHeaderWords; ++k) store_relaxed_v4(dst + k, src[k]);
}

// Row r of source p's landing area in this rank's half.
__device__ __forceinline__ const uint16_t* landing_row(const ExchangeView& E, const uint8_t* half,
                                                       int p, int64_t r) {
  return reinterpret_cast<const uint16_t*>(half + E.X.landing_offset + p * E.X.landing_stride +
                                           r * E.X.row_bytes);
}

// Copies the rows of this rank's `src` ((rows, inner) bf16) that owner q's shard rows [r0, r1)
// cover, elements [h0, h1) of each, into q's landing area (slot [rank]) of `call`'s half. Rows at
// or past `rows` are padding: nothing is sent, the owner reads zeros.
template <int V>
__device__ __forceinline__ void push_shard_rows(const ExchangeView& E, uint64_t call,
                                                const uint16_t* src, int64_t inner, int64_t r0,
                                                int64_t r1, int64_t h0, int64_t h1) {
  const int64_t shard = E.X.in_rows;
  const int per_row = static_cast<int>((h1 - h0 + V - 1) / V);
  for (int k = 1; k <= E.s.world; ++k) {
    const int q = (E.s.rank + k) % E.s.world;
    const int64_t end = min(r1, E.rows - q * shard);  // rows of q's shard this rank holds
    if (end <= r0) continue;
    uint8_t* half = half_base(E.s, E.s.peers[q], call);
    for (RowWalk w(threadIdx.x, per_row, blockDim.x); r0 + w.row < end; w.next()) {
      const int64_t r = r0 + w.row, h = h0 + int64_t(w.col) * V;
      const Pack<V> v = Pack<V>::load(src + (q * shard + r) * inner + h);
      v.store(const_cast<uint16_t*>(landing_row(E, half, E.s.rank, r)) + h);
    }
  }
}

// x for project_block in the sharded boundary: the fp32 rank-order sum of the landed rows, rounded
// once to bf16; padding rows (past `valid`) are zeros. NaN when the block's first barrier or header
// check failed (`ok` false): then no landed row is read.
struct LandingX {
  const ExchangeView* E;
  const uint8_t* half;
  bool ok;

  template <int V>
  __device__ __forceinline__ void load(const PreArgs& a, int64_t t, int64_t h,
                                       float (&xv)[V]) const {
    if (!ok) return fill_nan(xv);
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.f;
    if (t < E->valid) {
      for (int p = 0; p < E->s.world; ++p) {
        float f[V];
        Pack<V>::load_l2(landing_row(*E, half, p, t) + h).to_float(f);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += f[k];
      }
    }
    Pack<V>::from_float(acc).to_float(xv);
  }
};

}  // namespace mhc_sp::cuda
