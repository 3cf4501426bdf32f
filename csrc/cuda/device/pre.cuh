// SPDX-License-Identifier: Apache-2.0
#pragma once
// The mHC pre pipeline on CUDA (docs/design.md §1 steps 1-5) for mhc_pre, mhc_post_pre,
// mhc_pre_broadcast and hc_head.
//
// Work split. The projection mix = X @ fn^T (T x M, K = streams * H, M = n(n+2) or n) is a GEMM
// with a tiny M and a huge K; fn (M x K fp32, 2.75 MB for n=4, H=7168) is larger than a token's
// stream, so it must be reused across many tokens. project_kernel takes a tile of 64 tokens and
// a slice of the hidden dimension (all streams of it): it stages the tile's bf16 stream values in
// shared memory (for mhc_post_pre computing the post on the way, which writes residual_out
// exactly once), multiplies them on the tensor cores and also sums their squares. K is split
// over blocks (split-K along H) so that small T still fills the GPU; each block writes its
// partial sums to a workspace. finish_group then adds the partials, computes the coefficients
// (Sinkhorn in registers, mhc_sp/detail/coefficients.h) and collapses the token's streams into the
// bf16 layer input with the fused RMSNorm.
//
// Summation order (batch invariance, docs/design.md §3b). A token's mix and sum of squares are
// added in one order fixed by H alone: per HC-wide chunk (a leaf), the tensor-core dot products of
// 16 values each, added in IEEE fp32 k-step by k-step; the leaves then pairwise (LeafTree). A block
// covers an aligned power-of-two group of chunks, a subtree of that tree, and the finish adds the
// blocks' subtrees in the same tree: so neither the token count, nor the split, nor the grid
// changes a bit of any token's outputs (nor do CUDA-graph replays). The collapse's norm is summed
// by kProjThreads threads in every launch, over the same positions whatever the vector width.
//
// Precision. mma.sync m16n8k16 with bf16 inputs. X is bf16 (exact); fn is fp32, so it is split
// into bf16 hi + mid + lo (split_bf16x3) and X is multiplied by each: the products are the fp32
// products to ~2^-24. Every MMA starts from zero, so the tensor cores' own accumulation (not
// IEEE-rounded) never spans more than one 16-value dot product.
//
// Launches. T <= kFusedMaxTokens (decode): one launch; the last projection block to finish
// (atomic counter, zeroed by a memset before the launch and reset by that block) runs the finish
// for the tile. Otherwise a second kernel runs the finish with one block per 4 tokens, so the
// collapse is spread over the whole GPU.

#include "mhc_sp/detail/coefficients.h"
#include "cuda/device/common.cuh"
#include "cuda/device/post.cuh"
#include "mhc_sp/detail/scalars.h"

namespace mhc_sp::cuda {

constexpr int kTileTokens = 64;    // tokens per projection block: 4 warps x m16
constexpr int kProjThreads = 128;  // 4 warps
// project_kernel's occupancy target: three blocks per SM, i.e. at most 168 registers, which its
// unrolled MMA loop and register tree fit without spilling (without a target ptxas may pick a
// lower register count and spill).
constexpr int kProjMinBlocks = 3;
constexpr int kFusedMaxTokens = 16;           // up to here post + pre run as a single launch
constexpr int kFinishTokens = 4;              // tokens per finish-kernel block iteration
constexpr int kFinishThreads = kProjThreads;  // the collapse sums its norm over this many threads
constexpr int kSplitLevels = 32;              // the finish adds any number of blocks' partials
constexpr int kSplitBatch = 8;                // partials the finish loads before adding them

template <int N, Mode MODE>
struct PreShape {
  static constexpr int NS = MODE == Mode::Broadcast ? 1 : N;      // streams the projection reads
  static constexpr int M = MODE == Mode::Head ? N : N * (N + 2);  // fn rows
  static constexpr int MP1 = M + 1;                               // + the sum of squares
  static constexpr int NT8 = (M + 7) / 8;                         // n8 MMA tiles covering M
  // Hidden positions per staged chunk: a multiple of 16 (one MMA k-step never crosses streams),
  // about 128 staged k values in all.
  static constexpr int HC = (128 / NS) / 16 * 16 >= 16 ? (128 / NS) / 16 * 16 : 16;
  static constexpr int KC = NS * HC;  // k values per chunk
  static constexpr int LDX = KC + 8;  // padded row: A-fragment loads hit 32 distinct banks
  // A chunk's leaf as one lane holds it: its MMA outputs (rows g, g + 8 of every n8 tile), then the
  // squares of rows g and g + 8.
  static constexpr int kLeaf = NT8 * 4 + 2;
  static constexpr int kStageBytes = kTileTokens * LDX * 2;
  static constexpr int kCoefs = MODE == Mode::PostPre ? kTileTokens * (N + N * N) : 1;
  // Levels of a block's LeafTree: the lowest in registers (about 48 floats of pending nodes per
  // lane), up to three more in shared memory as long as the block's static shared memory stays
  // within 48 KB. A block adds at most 2^(kBlockLevels - 1) chunks (plan_pre splits H finer):
  // 32 for hc_mult 4.
  static constexpr int kRegLevels = 48 / kLeaf < 1 ? 1 : (48 / kLeaf > 6 ? 6 : 48 / kLeaf);
  static constexpr int kTreeLevelBytes = kLeaf * kProjThreads * 4;
  static constexpr int kSmemSpare = 47 * 1024 - kStageBytes - kCoefs * 4;
  static constexpr int kSmemLevels =
      kSmemSpare / kTreeLevelBytes > 3 ? 3 : kSmemSpare / kTreeLevelBytes;
  // Wide leaves (hc_mult > 4) leave fewer than six such levels: up to twelve in all then, the rest
  // in local memory (touched once every 2^(kRegLevels + kSmemLevels) chunks), rather than many
  // more blocks' partial sums through global memory.
  static constexpr int kFarLevels =
      kRegLevels + kSmemLevels >= 6 ? 0 : 12 - kRegLevels - kSmemLevels;
  static constexpr int kBlockLevels = kRegLevels + kSmemLevels + kFarLevels;
  // project_block's static shared memory: staging, the tile's coefficients, the tree's levels.
  // hc_mult 7 comes closest to the 48 KB a block may have without opting in to more (46 KB); the
  // kernels' other shared words (is_last, the refusal word) must fit the rest.
  static constexpr int kStaticSmemBytes =
      kStageBytes + kCoefs * 4 + (kSmemLevels > 0 ? kSmemLevels * kTreeLevelBytes : 4);
  static_assert(kStaticSmemBytes + 1024 <= 48 * 1024,
                "a projection block keeps 1 KB of the 48 KB static shared memory for other words");
  // The fused finish reuses the staging buffer: mix sums, pre weights, reduction scratch.
  static constexpr int kFusedFinishBytes = (kFusedMaxTokens * (MP1 + N) + 32) * 4;
  static_assert(kFusedFinishBytes <= kStageBytes,
                "fused finish scratch must fit the staging buffer");
  static_assert(HC % 16 == 0 && KC % 16 == 0, "MMA k-steps of 16");
};

struct PreArgs {
  int64_t T, H;
  const uint16_t* src;       // Pre/Head: residual (T,N,H); PostPre: the post's input residual;
                             // Broadcast: x (T,H)
  const uint16_t* x;         // PostPre: the sublayer output x (T,H)
  const float* post_in;      // PostPre: (T,N)
  const float* comb_in;      // PostPre: (T,N,N)
  uint16_t* stream_out;      // PostPre / Broadcast: residual_out (T,N,H)
  const float* fn;           // (M, NS*H)
  const float* scale;        // (3,) or (1,)
  const float* base;         // (M,)
  const float* norm_weight;  // (H,) or nullptr
  MhcScalars s;
  float* post;           // (T,N) or nullptr (Head)
  float* comb;           // (T,N,N) or nullptr (Head)
  uint16_t* out;         // (T,H)
  float* ws;             // partials: (tiles * splits, kTileTokens, MP1)
  int* counters;         // fused launch only: one per tile
  int splits;            // blocks per token tile along H
  int chunks_per_split;  // HC-wide chunks per block: a power of two (see LeafTree)
  // float(streams * H), the RMS's divisor, from the plan (use_plan): as a kernel parameter it is
  // read where it is used, while a value converted in the kernel is hoisted out of the finish's
  // token loop and (sm_100a) kept on the stack across the Sinkhorn's fp32-division slow-path calls.
  float rms_count;
};

// Where mhc_post_pre's staging reads the sublayer output x: straight from a.x here; the
// symmetric-memory boundary (transport/symm/device/) passes its own source, which reduces the
// peers' rows on the fly. load<V> fills V widened values of token t at hidden position h.
struct DirectX {
  template <int V>
  __device__ __forceinline__ void load(const PreArgs& a, int64_t t, int64_t h,
                                       float (&xv)[V]) const {
    Pack<V>::load(a.x + t * a.H + h).to_float(xv);
  }
};

// Stages chunk [h0, h0 + HC) of every stream of the tile's tokens into Xs (row tt, column
// i * HC + hh), zero-filling tokens >= T and positions >= H. PostPre computes the post here
// (writing residual_out) and stages its rounded output; Broadcast writes the n stream copies.
template <int N, Mode MODE, int V, class XSrc>
__device__ __forceinline__ void stage_chunk(const PreArgs& a, int64_t tile, int64_t h0,
                                            uint16_t* Xs, const float* coef_s, const XSrc& xsrc) {
  using S = PreShape<N, MODE>;
  constexpr int kVecs = S::HC / V;
  const int64_t H = a.H;
  for (int u = threadIdx.x; u < kTileTokens * kVecs; u += kProjThreads) {
    const int tt = u / kVecs, hv = u % kVecs;
    const int64_t t = tile * kTileTokens + tt;
    const int64_t h = h0 + int64_t(hv) * V;  // V == 8 implies H % 8 == 0: the vector is whole
    uint16_t* xs = Xs + tt * S::LDX + hv * V;
    if (t >= a.T || h >= H) {
#pragma unroll
      for (int i = 0; i < S::NS; ++i) Pack<V>::zero().store(xs + i * S::HC);
      continue;
    }
    if constexpr (MODE == Mode::PostPre) {
      const float* c = coef_s + tt * (N + N * N);
      float xv[V];
      xsrc.template load<V>(a, t, h, xv);
      post_values<N, V>(xv, a.src + t * N * H + h, H, c, c + N, a.stream_out + t * N * H + h, xs,
                        S::HC);
    } else if constexpr (MODE == Mode::Broadcast) {
      const Pack<V> v = Pack<V>::load(a.src + t * H + h);
      v.store(xs);
#pragma unroll
      for (int i = 0; i < N; ++i) v.store(a.stream_out + (t * N + i) * H + h);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) Pack<V>::load(a.src + (t * N + i) * H + h).store(xs + i * S::HC);
    }
  }
}

// layer_input[t] = bf16(sum_i pre[i] * stream_i), then (mhc_pre family, norm_weight set) the
// fused RMSNorm over float(bf16(y)). Whole block, one token. Each thread takes 8 consecutive
// positions per step, as one vector or (V == 1) one by one, so that its share of the norm's sum
// and the order it adds them in are the same on both paths.
template <int N, Mode MODE, int V>
__device__ void collapse_token(const PreArgs& a, int64_t t, const float* pre_sm, float* red) {
  constexpr int G = 8;
  const int64_t H = a.H;
  float pre[N];
  const uint16_t* rows[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    pre[i] = pre_sm[i];
    if constexpr (MODE == Mode::Broadcast) {
      rows[i] = a.src + t * H;  // every stream is x
    } else if constexpr (MODE == Mode::PostPre) {
      rows[i] = a.stream_out + (t * N + i) * H;
    } else {
      rows[i] = a.src + (t * N + i) * H;
    }
  }
  uint16_t* out = a.out + t * H;
  const bool norm = MODE != Mode::Head && a.norm_weight != nullptr;
  const int64_t step = int64_t(blockDim.x) * G;
  float sq = 0.f;
  for (int64_t g = int64_t(threadIdx.x) * G; g < H; g += step) {
#pragma unroll
    for (int s = 0; s < G; s += V) {
      const int64_t h = g + s;
      if (h >= H) break;  // V == 1 only: with V == 8, H % 8 == 0
      float y[V];
#pragma unroll
      for (int e = 0; e < V; ++e) y[e] = 0.f;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        float v[V];
        // residual_out was written in this launch (fused path) by other blocks: read via L2.
        if constexpr (MODE == Mode::PostPre) {
          Pack<V>::load_l2(rows[i] + h).to_float(v);
        } else {
          Pack<V>::load(rows[i] + h).to_float(v);
        }
#pragma unroll
        for (int e = 0; e < V; ++e) y[e] = fmaf(pre[i], v[e], y[e]);
      }
      const Pack<V> packed = Pack<V>::from_float(y);
      packed.store(out + h);
      if (norm) {
        float r[V];
        packed.to_float(r);
#pragma unroll
        for (int e = 0; e < V; ++e) sq = fmaf(r[e], r[e], sq);
      }
    }
  }
  if (!norm) return;  // uniform over the block
  const float total = block_sum(sq, red);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(H) + a.s.norm_eps);
  // Each thread re-reads exactly the positions it wrote above.
  for (int64_t g = int64_t(threadIdx.x) * G; g < H; g += step) {
#pragma unroll
    for (int s = 0; s < G; s += V) {
      const int64_t h = g + s;
      if (h >= H) break;
      float v[V];
      Pack<V>::load_l2(out + h).to_float(v);
#pragma unroll
      for (int e = 0; e < V; ++e) v[e] = v[e] * inv * __ldg(a.norm_weight + h + e);
      Pack<V>::from_float(v).store(out + h);
    }
  }
}

// Tokens [t0, t0 + count): add the split partials, compute the coefficients (one thread per
// token), write post/comb, then collapse token by token with the whole block.
// mix_s: count * MP1 floats, pre_s: count * N floats, red: 32 floats (shared memory).
template <int N, Mode MODE, int V>
__device__ void finish_group(const PreArgs& a, int64_t t0, int count, float* mix_s, float* pre_s,
                             float* red) {
  using S = PreShape<N, MODE>;
  const int64_t split_stride = int64_t(kTileTokens) * S::MP1;
  for (int e = threadIdx.x; e < count * S::MP1; e += blockDim.x) {
    const int r = e / S::MP1, m = e % S::MP1;
    const int64_t t = t0 + r;
    const int64_t tile = t / kTileTokens, row = t % kTileTokens;
    const float* p = a.ws + (tile * a.splits * kTileTokens + row) * S::MP1 + m;
    LeafTree<1, kSplitLevels> tree;  // the blocks' subtrees, in the projection's tree
    // The partials are independent loads: a batch is issued before any of it is added, so that
    // a decode's one finishing block waits on L2 once per batch instead of once per split (an
    // H200 took 112 us for a T = 1 mhc_pre at H = 7168, 224 splits, nearly all in this kernel).
    // The adds keep their order: the sum is the same, bit for bit.
    int sp = 0;
    for (; sp + kSplitBatch <= a.splits; sp += kSplitBatch) {
      float v[kSplitBatch];
#pragma unroll
      for (int k = 0; k < kSplitBatch; ++k) v[k] = __ldcg(p + (sp + k) * split_stride);
#pragma unroll
      for (int k = 0; k < kSplitBatch; ++k) tree.push({v[k]});
    }
    for (; sp < a.splits; ++sp) tree.push({__ldcg(p + sp * split_stride)});
    float sum[1];
    tree.total(sum);
    mix_s[e] = sum[0];
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < count) {
    const int64_t t = t0 + threadIdx.x;
    const float* mix = mix_s + threadIdx.x * S::MP1;
    const float inv_rms = 1.0f / sqrtf(mix[S::M] / a.rms_count + a.s.rms_eps);
    float pre[N];
    if constexpr (MODE == Mode::Head) {
      pre_weights(mix, inv_rms, a.scale[0], a.base, N, a.s.hc_pre_eps, pre);
    } else {
      float post[N], comb[N * N];  // registers: N is a compile-time constant, loops unroll
      mhc_coefficients(mix, inv_rms, a.scale, a.base, N, a.s, pre, post, comb);
#pragma unroll
      for (int j = 0; j < N; ++j) a.post[t * N + j] = post[j];
#pragma unroll
      for (int k = 0; k < N * N; ++k) a.comb[t * N * N + k] = comb[k];
    }
#pragma unroll
    for (int i = 0; i < N; ++i) pre_s[threadIdx.x * N + i] = pre[i];
  }
  __syncthreads();
  for (int r = 0; r < count; ++r) collapse_token<N, MODE, V>(a, t0 + r, pre_s + r * N, red);
}

// The projection's staging buffer (one per block of a kernel), which the fused finish reuses.
template <int N, Mode MODE>
__device__ __forceinline__ uint4* stage_memory() {
  __shared__ uint4 stage_raw[(PreShape<N, MODE>::kStageBytes + 15) / 16];
  return stage_raw;
}

// Work item `block` (of tiles * splits): token tile block / splits, H-slice block % splits.
// kProjThreads threads. Also the body of the symmetric-memory boundary's kernels, which run
// several items per block and pass their own x source; the summation order is the same.
// Returns, in a fused launch, whether this block completed its tile's partials: the caller then
// runs fused_finish for the tile (after its loop over items, when it has one, so that the
// finish's registers never add to the loop's).
template <int N, Mode MODE, int V, class XSrc>
__device__ __forceinline__ bool project_block(const PreArgs& a, bool fused, int64_t block,
                                              const XSrc& xsrc) {
  using S = PreShape<N, MODE>;
  uint4* stage_raw = stage_memory<N, MODE>();
  __shared__ float coef_s[S::kCoefs];
  __shared__ int is_last;
  uint16_t* Xs = reinterpret_cast<uint16_t*>(stage_raw);

  const int item = static_cast<int>(block);  // plan_pre keeps the item count within an int
  const int64_t tile = item / a.splits;
  const int split = item % a.splits;
  const int64_t h_begin = int64_t(split) * a.chunks_per_split * S::HC;
  const int64_t h_end = min(a.H, h_begin + int64_t(a.chunks_per_split) * S::HC);

  if constexpr (MODE == Mode::PostPre) {  // the tile's post/comb, read once per block
    // Row tt of coef_s is post[t] then comb[t]. Two loops over the tile's contiguous post and
    // comb values: a thread's element of every iteration sits a fixed stride from its first, so
    // the unrolled loops need a base address rather than an index pair per iteration, which
    // sm_100a's project_kernel kept on the stack (8-16 bytes).
    constexpr int kPer = N + N * N;
    const int64_t rows = min(int64_t(kTileTokens), a.T - tile * kTileTokens);
    const float* post_in = a.post_in + tile * kTileTokens * N;
    const float* comb_in = a.comb_in + tile * kTileTokens * N * N;
    for (int e = threadIdx.x; e < kTileTokens * N; e += kProjThreads) {
      const int tt = e / N;
      coef_s[tt * kPer + e % N] = tt < rows ? post_in[e] : 0.f;
    }
    for (int e = threadIdx.x; e < kTileTokens * N * N; e += kProjThreads) {
      const int tt = e / (N * N);
      coef_s[tt * kPer + N + e % (N * N)] = tt < rows ? comb_in[e] : 0.f;
    }
  }  // the first barrier of the chunk loop orders these writes before their use

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  constexpr int kLeaf = S::kLeaf;
  // The tree's upper levels: this thread's column of tree_s (stride kProjThreads: no bank
  // conflicts).
  __shared__ float tree_s[S::kSmemLevels > 0 ? S::kSmemLevels * kLeaf * kProjThreads : 1];
  LeafTree<kLeaf, S::kRegLevels, S::kSmemLevels, S::kFarLevels> tree;
  tree.upper = tree_s + threadIdx.x;
  tree.stride = kProjThreads;
  const uint16_t* xa = Xs + (warp * 16 + g) * S::LDX + 2 * c;
  const int64_t ldf = int64_t(S::NS) * a.H;  // fn row stride

  for (int64_t h0 = h_begin; h0 < h_end; h0 += S::HC) {
    __syncthreads();  // previous chunk's MMAs are done reading Xs
    stage_chunk<N, MODE, V>(a, tile, h0, Xs, coef_s, xsrc);
    __syncthreads();
    float leaf[kLeaf];
#pragma unroll
    for (int e = 0; e < kLeaf; ++e) leaf[e] = 0.f;
    float& ss_g = leaf[kLeaf - 2];  // this lane's share of rows g and g + 8, then the group's
    float& ss_g8 = leaf[kLeaf - 1];
    // The k-steps' fn loads are independent of each other, and a whole unrolled chunk issues
    // them all ahead. On sm_100a ptxas then wanted more than 255 registers in the symm kernels
    // (the exchange's state beside the tree) and spilled about 100 bytes: there the loop is
    // unrolled two k-steps at a time (205-219 registers, no frame; tests/cuda/test_cubins.py
    // holds both architectures to none).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#pragma unroll 2
#else
#pragma unroll
#endif
    for (int ks = 0; ks < S::KC / 16; ++ks) {
      uint32_t A[4];
      A[0] = *reinterpret_cast<const uint32_t*>(xa + ks * 16);
      A[1] = *reinterpret_cast<const uint32_t*>(xa + ks * 16 + 8 * S::LDX);
      A[2] = *reinterpret_cast<const uint32_t*>(xa + ks * 16 + 8);
      A[3] = *reinterpret_cast<const uint32_t*>(xa + ks * 16 + 8 * S::LDX + 8);
      // Every staged value sits in exactly one lane's A fragment once: sum the squares here.
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float lo = bf16_bits_to_float(A[q] & 0xffffu), hi = bf16_bits_to_float(A[q] >> 16);
        if (q == 0 || q == 2) {
          ss_g = fmaf(lo, lo, fmaf(hi, hi, ss_g));
        } else {
          ss_g8 = fmaf(lo, lo, fmaf(hi, hi, ss_g8));
        }
      }
      const int stream = (ks * 16) / S::HC;
      const int64_t hk = h0 + (ks * 16) % S::HC + 2 * c;  // hidden index of b[0]'s low half
      const float* fcol = a.fn + int64_t(stream) * a.H;
      const bool ok0 = hk < a.H, ok1 = hk + 1 < a.H, ok8 = hk + 8 < a.H, ok9 = hk + 9 < a.H;
#pragma unroll
      for (int nt = 0; nt < S::NT8; ++nt) {
        const int m = nt * 8 + g;
        float f0 = 0.f, f1 = 0.f, f8 = 0.f, f9 = 0.f;  // B = fn^T; rows m >= M and h >= H are 0
        if (m < S::M) {
          const float* fr = fcol + m * ldf + hk;
          if (ok0) f0 = __ldg(fr);
          if (ok1) f1 = __ldg(fr + 1);
          if (ok8) f8 = __ldg(fr + 8);
          if (ok9) f9 = __ldg(fr + 9);
        }
        uint32_t b0[3], b1[3];
        split_bf16x3(f0, f1, b0[0], b0[1], b0[2]);
        split_bf16x3(f8, f9, b1[0], b1[1], b1[2]);
        float d[3][4];
#pragma unroll
        for (int k = 0; k < 3; ++k) mma_bf16_m16n8k16(d[k], A, b0[k], b1[k]);
#pragma unroll
        for (int e = 0; e < 4; ++e) leaf[nt * 4 + e] += d[0][e] + (d[1][e] + d[2][e]);
      }
    }
    // The 4 lanes of a group share rows g and g + 8: combine their squares (each lane ends up
    // with the same sum).
    ss_g += __shfl_xor_sync(0xffffffffu, ss_g, 1);
    ss_g += __shfl_xor_sync(0xffffffffu, ss_g, 2);
    ss_g8 += __shfl_xor_sync(0xffffffffu, ss_g8, 1);
    ss_g8 += __shfl_xor_sync(0xffffffffu, ss_g8, 2);
    tree.push(leaf);
  }

  float acc[kLeaf];
  tree.total(acc);
  float* part = a.ws + block * kTileTokens * S::MP1;
  const int r0 = warp * 16 + g, r1 = r0 + 8;
#pragma unroll
  for (int nt = 0; nt < S::NT8; ++nt) {
    const int m = nt * 8 + 2 * c;
    if (m < S::M) {
      part[r0 * S::MP1 + m] = acc[nt * 4 + 0];
      part[r1 * S::MP1 + m] = acc[nt * 4 + 2];
    }
    if (m + 1 < S::M) {
      part[r0 * S::MP1 + m + 1] = acc[nt * 4 + 1];
      part[r1 * S::MP1 + m + 1] = acc[nt * 4 + 3];
    }
  }
  if (c == 0) {
    part[r0 * S::MP1 + S::M] = acc[kLeaf - 2];
    part[r1 * S::MP1 + S::M] = acc[kLeaf - 1];
  }
  if (!fused) return false;

  // Last-block-done: every thread publishes its writes (partials, residual_out), then one
  // counter increment per block; the block that completes the tile runs its finish.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int done = atomicAdd(a.counters + tile, 1);
    __threadfence();  // orders this block's later reads of the other blocks' partials
    is_last = done == a.splits - 1;
  }
  __syncthreads();
  return is_last != 0;
}

// The finish of fused tile `tile` (T <= kFusedMaxTokens: the only one) by the block whose
// project_block returned true, in the staging buffer the projection is done with.
template <int N, Mode MODE, int V>
__device__ __forceinline__ void fused_finish(const PreArgs& a, int64_t tile) {
  using S = PreShape<N, MODE>;
  __threadfence();
  // Leave it zeroed (the launcher memsets it too). An atomic store: the other blocks' increments
  // are ordered before it only through the counter itself, so a plain store would race them.
  if (threadIdx.x == 0) atomicExch(a.counters + tile, 0);
  const int count = static_cast<int>(min(int64_t(kTileTokens), a.T - tile * kTileTokens));
  float* scratch = reinterpret_cast<float*>(stage_memory<N, MODE>());
  finish_group<N, MODE, V>(a, tile * kTileTokens, count, scratch,
                           scratch + kFusedMaxTokens * S::MP1,
                           scratch + kFusedMaxTokens * (S::MP1 + N));
}

// Grid: tiles * splits blocks, one work item each.
template <int N, Mode MODE, int V>
__global__ void __launch_bounds__(kProjThreads, kProjMinBlocks)
    project_kernel(PreArgs a, bool fused) {
  if (project_block<N, MODE, V>(a, fused, blockIdx.x, DirectX{})) {
    fused_finish<N, MODE, V>(a, static_cast<int>(blockIdx.x) / a.splits);
  }
}

// Non-fused finish: blocks stride over groups of kFinishTokens tokens.
template <int N, Mode MODE, int V>
__global__ void __launch_bounds__(kFinishThreads) finish_kernel(PreArgs a) {
  using S = PreShape<N, MODE>;
  __shared__ float mix_s[kFinishTokens * S::MP1];
  __shared__ float pre_s[kFinishTokens * N];
  __shared__ float red[32];
  const int64_t groups = (a.T + kFinishTokens - 1) / kFinishTokens;
  for (int64_t gi = blockIdx.x; gi < groups; gi += gridDim.x) {
    const int64_t t0 = gi * kFinishTokens;
    finish_group<N, MODE, V>(a, t0, static_cast<int>(min(int64_t(kFinishTokens), a.T - t0)), mix_s,
                             pre_s, red);
    __syncthreads();  // mix_s / pre_s are rewritten by the next group
  }
}

}  // namespace mhc_sp::cuda
