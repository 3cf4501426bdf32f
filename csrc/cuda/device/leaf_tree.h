// SPDX-License-Identifier: Apache-2.0
#pragma once
// The pairwise tree that fixes the summation order of the pre family's projection on CUDA
// (cuda/device/pre.cuh). Host and device code: the kernels use it, and a CPU test checks its
// order against an independent model (mhc_sp._testing.leaf_tree_sum, tests/ops/test_leaf_tree.py).

#include <cstdint>

#if !defined(MHC_SP_HOST_DEVICE)
#if defined(__CUDACC__)
#define MHC_SP_HOST_DEVICE __host__ __device__
#else
#define MHC_SP_HOST_DEVICE
#endif
#endif

namespace mhc_sp::cuda {

// Pairwise sums of W-wide leaves in one tree fixed by the leaf count alone. Leaf j is pushed j-th;
// node (level L, j) holds leaves [j * 2^L, (j + 1) * 2^L) and is formed, when its last leaf
// arrives, as (left node) + (right node). After k pushes the pending nodes are one per set bit of
// k, at the level of that bit; total() adds them from the lowest level (the rightmost node) up:
// node + sum so far. Pushing the leaves of aligned power-of-two groups and then the groups' totals
// gives bitwise the same sum as pushing every leaf: the projection's blocks and its finish split
// the work however they like and still add in one order.
//
// Where the pending nodes live. The pending node of level L < kRegLevels is node[L], valid while
// bit L of `pushed` is set; every loop over those levels and over W is unrolled and has no early
// exit, so each index is a compile-time constant and the nodes stay in registers (an array indexed
// at run time would go to local memory). Levels kRegLevels .. kRegLevels + kSmemLevels - 1 are
// reached only every 2^kRegLevels pushes; they live in memory the caller owns (shared memory in the
// kernels): element w of level kRegLevels + u at upper[(u * W + w) * stride]. Shapes whose nodes
// are too wide for that (hc_mult > 4) keep kFarLevels more levels in far[], local memory, reached
// still more rarely. At most 2^(kLevels - 1) leaves may be pushed (plan_pre bounds a block's leaves
// by that).
template <int W, int kRegLevels, int kSmemLevels = 0, int kFarLevels = 0>
struct LeafTree {
  static constexpr int kLevels = kRegLevels + kSmemLevels + kFarLevels;
  static constexpr int kNear = kRegLevels + kSmemLevels;
  float node[kRegLevels][W];
  float far[kFarLevels > 0 ? kFarLevels : 1][W];
  float* upper = nullptr;
  int stride = 0;
  uint32_t pushed = 0;

  MHC_SP_HOST_DEVICE inline void push(const float (&leaf)[W]) {
    // The carry merges with the nodes of the levels below the lowest clear bit of `pushed` and
    // waits at that level.
    const uint32_t free_bit = ~pushed & (pushed + 1u);
    float carry[W];
#pragma unroll
    for (int w = 0; w < W; ++w) carry[w] = leaf[w];
#pragma unroll
    for (int level = 0; level < kRegLevels; ++level) {
      const uint32_t bit = 1u << level;
      if (bit < free_bit) {
#pragma unroll
        for (int w = 0; w < W; ++w) carry[w] = node[level][w] + carry[w];  // left + right
      } else if (bit == free_bit) {
#pragma unroll
        for (int w = 0; w < W; ++w) node[level][w] = carry[w];
      }
    }
    if constexpr (kSmemLevels > 0) {
      if (free_bit >= (1u << kRegLevels)) {  // the carry climbs past the register levels
        for (int u = 0; u < kSmemLevels; ++u) {
          float* n = upper + u * W * stride;
          if ((1u << (kRegLevels + u)) == free_bit) {
#pragma unroll
            for (int w = 0; w < W; ++w) n[w * stride] = carry[w];
            break;
          }
#pragma unroll
          for (int w = 0; w < W; ++w) carry[w] = n[w * stride] + carry[w];
        }
      }
    }
    if constexpr (kFarLevels > 0) {
      if (free_bit >= (1u << kNear)) {
        for (int u = 0; u < kFarLevels; ++u) {
          if ((1u << (kNear + u)) == free_bit) {
#pragma unroll
            for (int w = 0; w < W; ++w) far[u][w] = carry[w];
            break;
          }
#pragma unroll
          for (int w = 0; w < W; ++w) carry[w] = far[u][w] + carry[w];
        }
      }
    }
    ++pushed;
  }

  MHC_SP_HOST_DEVICE inline void total(float (&out)[W]) const {
#pragma unroll
    for (int w = 0; w < W; ++w) out[w] = 0.f;  // no leaves: 0 (never the case in the kernels)
    bool first = true;
#pragma unroll
    for (int level = 0; level < kRegLevels; ++level) {
      if (((pushed >> level) & 1u) != 0u) {
#pragma unroll
        for (int w = 0; w < W; ++w) out[w] = first ? node[level][w] : node[level][w] + out[w];
        first = false;
      }
    }
    for (int u = 0; u < kSmemLevels; ++u) {
      if (((pushed >> (kRegLevels + u)) & 1u) != 0u) {
        const float* n = upper + u * W * stride;
#pragma unroll
        for (int w = 0; w < W; ++w) out[w] = first ? n[w * stride] : n[w * stride] + out[w];
        first = false;
      }
    }
    for (int u = 0; u < kFarLevels; ++u) {
      if (((pushed >> (kNear + u)) & 1u) != 0u) {
#pragma unroll
        for (int w = 0; w < W; ++w) out[w] = first ? far[u][w] : far[u][w] + out[w];
        first = false;
      }
    }
  }
};

}  // namespace mhc_sp::cuda
