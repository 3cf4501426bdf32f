// SPDX-License-Identifier: Apache-2.0
#pragma once
// fused_layer on the symm transport: the replicated (decode) boundary in one kernel over the
// Lamport mailbox, and the sharded boundary in two kernels over the barrier exchange. Each kernel's
// body is a __device__ function of one rank's parameters (a __grid_constant__ struct: no per-thread
// copy); the production kernels (transport/symm/collective_launch.cu) run it for this process's
// rank, and the testing module (csrc/testing/) wraps the same bodies to run several simulated ranks
// in one launch.
//
// Index arithmetic. Copy loops walk rows and 16-byte vectors by addition (RowWalk), and loops that
// stride by the grid stay rolled (#pragma unroll 1): unrolling one needs its trip count, a 64-bit
// division. Nothing here keeps an array in local memory (tests/cuda/test_cubins.py checks the
// cubins).

#include <cuda_runtime.h>

#include "cuda/device/pre.cuh"
#include "transport/symm/device/exchange.cuh"
#include "transport/symm/device/lamport.cuh"
#include "transport/symm/device/sync.cuh"

namespace mhc_sp::cuda {

// The decode boundary runs post + pre as one fused launch of one token tile.
static_assert(symm::kLamportMaxTokens <= kFusedMaxTokens && symm::kLamportMaxTokens <= kTileTokens,
              "a Lamport boundary is one fused token tile");

// The projection kernels here carry a rank's exchange state beside project_block's registers:
// target two blocks per SM (plan_pre's aim), so that ptxas keeps all of it in registers.
constexpr int kSymmProjMinBlocks = 2;

// ---- the replicated (decode) boundary: all-reduce + post + pre in one kernel --------------------

struct LamportLayerParams {
  RankView s;
  PreArgs pre;              // PostPre: x unused (it comes from the mailbox)
  const uint16_t* partial;  // (T, H)
  int64_t items;            // plan_pre's work items (one token tile for T <= kLamportMaxTokens)
};

// A refused or mismatched call still runs the post and the projection, on x = NaN (LamportX), so
// that residual_out, post, comb and layer_input all come out NaN through the one code path.
template <int N, int V>
__device__ __forceinline__ void lamport_layer(const LamportLayerParams& R) {
  const RankView& s = R.s;
  using S = PreShape<N, Mode::PostPre>;
  constexpr uint32_t kOp = static_cast<uint32_t>(boundary::Op::kFusedLayer);
  const PreArgs& a = R.pre;
  const uint64_t call = read_call(&s.state->lamport_calls);
  const int64_t mailbox = symm::mailbox_index(call);
  const LamportTag tag =
      symm::lamport_tag(boundary::Op::kFusedLayer, a.T, a.H, call, gridDim.x, a.chunks_per_split);
  const bool ok = lamport_start(s, kOp, mailbox, tag, call, [&] {
  // This block's items: all T rows of their H-slices.
#pragma unroll 1
    for (int64_t item = blockIdx.x; item < R.items; item += gridDim.x) {
      const int split = static_cast<int>(item) % a.splits;
      const int64_t h0 = int64_t(split) * a.chunks_per_split * S::HC;
      const int64_t h1 = min(a.H, h0 + int64_t(a.chunks_per_split) * S::HC);
      lamport_push<V>(s, mailbox, R.partial, a.H, a.T, h0, h1);
    }
  });
  const LamportX xs = lamport_x(s, mailbox, call, ok);
  bool finish = false;  // one token tile: the block that completes it runs the finish
#pragma unroll 1
  for (int64_t item = blockIdx.x; item < R.items; item += gridDim.x) {
    finish |= project_block<N, Mode::PostPre, V>(a, true, item, xs);
  }
  if (finish) fused_finish<N, Mode::PostPre, V>(a, 0);
  end_call(&s.state->lamport_done, &s.state->lamport_calls,
           [&] { rearm_lamport_tags(s, mailbox); });
}

// ---- the sharded boundary: push-reduce-scatter + post + pre, then finish + all-gather -----------

struct ShardedLayerParams {
  ExchangeView e;
  PreArgs pre;              // PostPre over the shard (T = shard rows); pre.out is replaced
  const uint16_t* partial;  // (rows, H)
  uint16_t* gathered;       // (num_tokens, H): the fresh layer_input
  int64_t items;            // plan_pre's work items over the shard
};

// Kernel A: push-reduce-scatter, barrier and header check, then the post (x summed on the fly) and
// the projection of the shard; the partial sums go to pre.ws for kernel B. Refused: nothing (B
// fills the call's outputs with NaN).
template <int N, int V>
__device__ __forceinline__ void sharded_layer_project(const ShardedLayerParams& R) {
  const ExchangeView& E = R.e;
  using S = PreShape<N, Mode::PostPre>;
  const PreArgs& a = R.pre;
  const int block = blockIdx.x;
  const uint64_t call = read_call(&E.s.state->exchange_calls);
  if (refused(E.s, E.header.op, call)) return;
  const uint64_t epoch = block_epoch(E.s, block) + 1;
  const CallHeader mine = header_of_call(E, call);
  push_header(E, mine, call);
#pragma unroll 1
  for (int64_t item = block; item < R.items; item += gridDim.x) {
    const int tile = static_cast<int>(item) / a.splits, split = static_cast<int>(item) % a.splits;
    const int64_t h0 = int64_t(split) * a.chunks_per_split * S::HC;
    const int64_t h1 = min(a.H, h0 + int64_t(a.chunks_per_split) * S::HC);
    const int64_t r0 = int64_t(tile) * kTileTokens, r1 = min(a.T, r0 + kTileTokens);
    push_shard_rows<V>(E, call, R.partial, a.H, r0, r1, h0, h1);
  }
  uint8_t* half = half_base(E.s, own_buffer(E.s), call);
  const bool ok = block_barrier(E.s, block, epoch, E.header.op, symm::kPhaseFirst, mine, half);
  set_block_epoch(E.s, block, epoch);
  // What is left is this rank's own projection, and B's first step waits for all of A: B's blocks
  // may be scheduled now, so that its launch overlaps the projection instead of following it.
  trigger_dependent_grid();
  const LandingX xs{&E, half, ok};
#pragma unroll 1
  for (int64_t item = block; item < R.items; item += gridDim.x) {
    project_block<N, Mode::PostPre, V>(a, false, item, xs);
  }
}

// Kernel B (a programmatic dependent of A in production): the finish (Sinkhorn, collapse, RMSNorm)
// of the shard's real rows into this rank's published `out` rows, zeros for the padding rows'
// post, comb and residual_out, barrier, then pull every rank's rows into the gathered output. On
// a broken workspace (A failed here, or a peer broke it) the block writes NaN over every output
// row of its groups, stream rows and gathered rows alike; a block whose barrier fails fills the
// gathered rows it would have pulled with NaN. Each block writes only its own groups' rows, so a
// call whose blocks see the break at different times still never has two writers of a row.
// Kernel A's grid has completed (stream order, or wait_for_prerequisite_grid under a programmatic
// dependent launch).
template <int N, int V>
__device__ __forceinline__ void sharded_layer_finish(const ShardedLayerParams& R) {
  const ExchangeView& E = R.e;
  using S = PreShape<N, Mode::PostPre>;
  __shared__ float mix_s[kFinishTokens * S::MP1];
  __shared__ float pre_s[kFinishTokens * N];
  __shared__ float red[32];
  const int block = blockIdx.x;
  const uint64_t call = read_call(&E.s.state->exchange_calls);
  const int64_t shard = R.pre.T, H = R.pre.H;
  const bool refuse = refused(E.s, E.header.op, call);
  uint8_t* half = half_base(E.s, own_buffer(E.s), call);
  PreArgs a = R.pre;
  a.out = reinterpret_cast<uint16_t*>(half + E.X.out_offset);
  const int64_t groups = (shard + kFinishTokens - 1) / kFinishTokens;
  const uint16_t nan_bits = 0xffffu;  // all-ones: NaN as bf16 and, two at a time, as fp32
#pragma unroll 1
  for (int64_t g = block; g < groups; g += gridDim.x) {
    const int64_t t0 = g * kFinishTokens, t1 = min(shard, t0 + kFinishTokens);
    const int64_t real = refuse ? 0 : max(int64_t(0), min(t1, E.valid) - t0);
    if (real > 0)
      finish_group<N, Mode::PostPre, V>(a, t0, static_cast<int>(real), mix_s, pre_s, red);
    // Padding rows of the stream outputs are zeros; every row of a refused call NaN.
    const float fill = refuse ? __int_as_float(-1) : 0.f;
    for (int64_t t = t0 + real; t < t1; ++t) {
      for (int k = threadIdx.x; k < N + N * N; k += blockDim.x) {
        if (k < N) {
          a.post[t * N + k] = fill;
        } else {
          a.comb[t * N * N + (k - N)] = fill;
        }
      }
      const uint16_t stream_fill = refuse ? nan_bits : uint16_t(0);
      for (int64_t k = threadIdx.x; k < N * H; k += blockDim.x) {
        a.stream_out[t * N * H + k] = stream_fill;
      }
    }
    __syncthreads();  // mix_s / pre_s are rewritten by the next group
  }
  bool ok = false;
  if (!refuse) {
    const uint64_t epoch = block_epoch(E.s, block) + 1;
    ok = block_barrier(E.s, block, epoch, E.header.op, symm::kPhaseSecond, E.header, nullptr);
    set_block_epoch(E.s, block, epoch);
  }
  // Pull: the rows of this block's groups from every rank (rank p's block `block` wrote them),
  // row by row, vectors across the threads.
  const int per_row = static_cast<int>(H / V);
  float nan_values[V];
  fill_nan(nan_values);
  const Pack<V> nan_pack = Pack<V>::from_float(nan_values);
#pragma unroll 1
  for (int64_t g = block; g < groups; g += gridDim.x) {
    const int64_t t0 = g * kFinishTokens, t1 = min(shard, t0 + kFinishTokens);
    for (int k = 0; k < E.s.world; ++k) {
      const int p = (E.s.rank + k) % E.s.world;
      const int64_t end = min(t1, E.header.num_tokens - p * shard);
      const uint16_t* src =
          reinterpret_cast<const uint16_t*>(half_base(E.s, E.s.peers[p], call) + E.X.out_offset);
      for (int64_t t = t0; t < end; ++t) {
        uint16_t* dst = R.gathered + (p * shard + t) * H;
        for (int v = threadIdx.x; v < per_row; v += blockDim.x) {
          if (ok) {
            Pack<V>::load_l2(src + t * H + int64_t(v) * V).store(dst + int64_t(v) * V);
          } else {
            nan_pack.store(dst + int64_t(v) * V);
          }
        }
      }
    }
  }
  end_call(&E.s.state->exchange_done, &E.s.state->exchange_calls);
}

}  // namespace mhc_sp::cuda
