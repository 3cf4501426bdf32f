// SPDX-License-Identifier: Apache-2.0
#pragma once
// The plain collectives of the symm transport: all_reduce through the Lamport mailbox (decode
// sizes), and reduce_scatter, all_reduce and all_gather over the barrier exchange. As in
// layer_kernels.cuh, each body is a __device__ function of one rank's parameters, run by the
// production kernels (transport/symm/collective_launch.cu) and by the testing module's multi-rank
// wrappers.

#include <cuda_runtime.h>

#include "cuda/device/pre.cuh"
#include "transport/symm/device/exchange.cuh"
#include "transport/symm/device/lamport.cuh"
#include "transport/symm/device/sync.cuh"

namespace mhc_sp::cuda {

// ---- plain all-reduce through the mailbox -------------------------------------------------------

constexpr int kCopyThreads = 256;
constexpr int kCopyMinBlocks = 1;  // no occupancy target: ptxas would trade spills for one
constexpr int64_t kSpanBytes = int64_t(kCopyThreads) * 16;  // one 16-byte vector per thread

static_assert(symm::kMaxRanks <= kCopyThreads && symm::kMaxRanks <= kProjThreads &&
                  symm::kMaxRanks <= kFinishThreads,
              "thread p < world of every block talks to rank p in a barrier");

struct LamportSumParams {
  RankView s;
  const uint16_t* in;  // numel bf16
  uint16_t* out;
  int64_t numel;
};

__device__ __forceinline__ void lamport_sum(const LamportSumParams& R) {
  constexpr int V = 8;
  constexpr uint32_t kOp = static_cast<uint32_t>(boundary::Op::kAllReduce);
  const RankView& s = R.s;
  const uint64_t call = read_call(&s.state->lamport_calls);
  const int64_t mailbox = symm::mailbox_index(call);
  const LamportTag tag =
      symm::lamport_tag(boundary::Op::kAllReduce, R.numel, 1, call, gridDim.x, 1);
  const int64_t span = int64_t(kCopyThreads) * V;
  const bool ok = lamport_start(s, kOp, mailbox, tag, call, [&] {
#pragma unroll 1
    for (int64_t e0 = int64_t(blockIdx.x) * span; e0 < R.numel; e0 += int64_t(gridDim.x) * span) {
      lamport_push<V>(s, mailbox, R.in, 0, 1, e0, min(e0 + span, R.numel));
    }
  });
  const LamportX xs = lamport_x(s, mailbox, call, ok);
#pragma unroll 1
  for (int64_t e0 = int64_t(blockIdx.x) * span; e0 < R.numel; e0 += int64_t(gridDim.x) * span) {
    const int64_t e = e0 + int64_t(threadIdx.x) * V;
    if (e < R.numel) {
      float x[V];
      xs.sum<V>(e, x);
      Pack<V>::from_float(x).store(R.out + e);
    }
  }
  end_call(&s.state->lamport_done, &s.state->lamport_calls,
           [&] { rearm_lamport_tags(s, mailbox); });
}

// ---- plain collectives over the barrier exchange -----------------------------------------------
// Rows are cut into spans of kSpanBytes; block b owns spans b, b + grid, ... in every phase, so
// each barrier pairs block b of every rank with exactly the data block b moved.

struct CollectiveParams {
  ExchangeView e;
  const uint8_t* in;  // (rows, row_bytes)
  uint8_t* out;       // reduce_scatter: (shard, row_bytes); all_reduce: (rows, row_bytes);
                      // all_gather: (kept rows of world * rows, row_bytes)
  int64_t out_bytes;  // the whole of `out`
};

// The spans block `blockIdx.x` owns: (row, span) for items block, block + grid, ... < rows * spans.
__device__ __forceinline__ RowWalk block_spans(int64_t row_bytes) {
  return RowWalk(blockIdx.x, static_cast<int>((row_bytes + kSpanBytes - 1) / kSpanBytes),
                 gridDim.x);
}

__device__ __forceinline__ void store_nan16(uint8_t* p) {
  *reinterpret_cast<uint4*>(p) = make_uint4(~0u, ~0u, ~0u, ~0u);
}

// reduce_scatter (kOp = kReduceScatter) and all_reduce (kAllReduce, = reduce-scatter + all-gather)
// of bf16 rows, row_bytes a multiple of 16.
template <boundary::Op kOp>
__device__ __forceinline__ void exchange_reduce(const CollectiveParams& R) {
  const ExchangeView& E = R.e;
  const int block = blockIdx.x;
  const int64_t rb = E.X.row_bytes, shard = E.X.in_rows;
  const uint64_t call = read_call(&E.s.state->exchange_calls);
  // Refused (a broken workspace): nothing is pushed or read, and the block writes NaN exactly
  // where it would have written results, as a failed barrier does.
  const bool refuse = refused(E.s, E.header.op, call);
  uint64_t epoch = block_epoch(E.s, block) + 1;
  const CallHeader mine = header_of_call(E, call);
  uint8_t* half = half_base(E.s, own_buffer(E.s), call);
  bool ok = false;
  if (!refuse) {
    push_header(E, mine, call);
    for (RowWalk w = block_spans(rb); w.row < shard; w.next()) {
      const int64_t b0 = int64_t(w.col) * kSpanBytes, b1 = min(rb, b0 + kSpanBytes);
      push_shard_rows<8>(E, call, reinterpret_cast<const uint16_t*>(R.in), rb / 2, w.row, w.row + 1,
                         b0 / 2, b1 / 2);
    }
    ok = block_barrier(E.s, block, epoch, E.header.op, symm::kPhaseFirst, mine, half);
  }
  const LandingX xs{&E, half, ok};  // NaN rows when the barrier or the header check failed
  for (RowWalk w = block_spans(rb); w.row < shard; w.next()) {
    const int64_t b = int64_t(w.col) * kSpanBytes + int64_t(threadIdx.x) * 16;
    if (b >= rb) continue;
    float x[8];
    xs.load<8>(PreArgs{}, w.row, b / 2, x);
    const Pack<8> v = Pack<8>::from_float(x);
    if constexpr (kOp == boundary::Op::kReduceScatter) {
      v.store(reinterpret_cast<uint16_t*>(R.out + w.row * rb + b));
    } else if (!refuse) {
      v.store(reinterpret_cast<uint16_t*>(half + E.X.out_offset + w.row * rb + b));
    }
  }
  if constexpr (kOp == boundary::Op::kAllReduce) {
    bool ok2 = false;
    if (!refuse) {
      set_block_epoch(E.s, block, epoch);
      epoch += 1;
      ok2 = block_barrier(E.s, block, epoch, E.header.op, symm::kPhaseSecond, mine, nullptr);
    }
    for (RowWalk w = block_spans(rb); w.row < shard; w.next()) {
      const int64_t b = int64_t(w.col) * kSpanBytes + int64_t(threadIdx.x) * 16;
      if (b >= rb) continue;
      for (int k = 0; k < E.s.world; ++k) {
        const int p = (E.s.rank + k) % E.s.world;
        if (p * shard + w.row >= E.rows) continue;
        uint8_t* dst = R.out + (p * shard + w.row) * rb + b;
        // After a failed first barrier the second one proves nothing about the peers' rows: a
        // rank launched another way (another grid) pairs this block with blocks that never
        // published them.
        if (!ok || !ok2) {
          store_nan16(dst);
          continue;
        }
        const uint8_t* src = half_base(E.s, E.s.peers[p], call) + E.X.out_offset + w.row * rb + b;
        Pack<8>::load_l2(reinterpret_cast<const uint16_t*>(src))
            .store(reinterpret_cast<uint16_t*>(dst));
      }
    }
  }
  if (!refuse) set_block_epoch(E.s, block, epoch);
  end_call(&E.s.state->exchange_done, &E.s.state->exchange_calls);
}

// all_gather of rows of any type (row_bytes a multiple of 16): publish own rows, barrier, pull.
__device__ __forceinline__ void exchange_gather(const CollectiveParams& R) {
  const ExchangeView& E = R.e;
  const int block = blockIdx.x;
  const int64_t rb = E.X.row_bytes, rows = E.X.out_rows;
  const uint64_t call = read_call(&E.s.state->exchange_calls);
  const bool refuse = refused(E.s, E.header.op, call);  // then NaN where the rows would go
  const uint64_t epoch = block_epoch(E.s, block) + 1;
  uint8_t* half = half_base(E.s, own_buffer(E.s), call);
  uint8_t* published = half + E.X.out_offset;
  const CallHeader mine = header_of_call(E, call);
  bool ok = false;
  if (!refuse) {
    push_header(E, mine, call);
    for (RowWalk w = block_spans(rb); w.row < rows; w.next()) {
      const int64_t b = int64_t(w.col) * kSpanBytes + int64_t(threadIdx.x) * 16;
      if (b < rb) {
        *reinterpret_cast<uint4*>(published + w.row * rb + b) =
            __ldg(reinterpret_cast<const uint4*>(R.in + w.row * rb + b));
      }
    }
    ok = block_barrier(E.s, block, epoch, E.header.op, symm::kPhaseFirst, mine, half);
    set_block_epoch(E.s, block, epoch);
  }
  // Keep only rows below the header's num_tokens (-1: all) of the concatenation.
  const int64_t keep = E.header.num_tokens < 0 ? rows * E.s.world : E.header.num_tokens;
  for (RowWalk w = block_spans(rb); w.row < rows; w.next()) {
    const int64_t b = int64_t(w.col) * kSpanBytes + int64_t(threadIdx.x) * 16;
    if (b >= rb) continue;
    for (int k = 0; k < E.s.world; ++k) {
      const int p = (E.s.rank + k) % E.s.world;
      if (p * rows + w.row >= keep) continue;
      uint8_t* dst = R.out + (p * rows + w.row) * rb + b;
      if (!ok) {
        store_nan16(dst);
        continue;
      }
      const uint8_t* src = half_base(E.s, E.s.peers[p], call) + E.X.out_offset + w.row * rb + b;
      *reinterpret_cast<uint4*>(dst) = __ldcg(reinterpret_cast<const uint4*>(src));
    }
  }
  end_call(&E.s.state->exchange_done, &E.s.state->exchange_calls);
}

}  // namespace mhc_sp::cuda
