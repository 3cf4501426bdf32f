// SPDX-License-Identifier: Apache-2.0
#pragma once
// Per-token mHC coefficients from the projected mix (docs/design.md §1 steps 2-4). Shared by the
// CPU and CUDA kernels so that both follow one definition of the Sinkhorn normalisation.

#include <cmath>

#include "mhc_sp/detail/scalars.h"

#if defined(__CUDACC__)
#define MHC_HD __host__ __device__ __forceinline__
#else
#define MHC_HD inline
#endif

namespace mhc_sp {

MHC_HD float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

// pre[i] = sigmoid(mix[i] * inv_rms * s0 + base[i]) + eps, i < n. Also the hc_head weights.
MHC_HD void pre_weights(const float* mix, float inv_rms, float s0, const float* base, int n,
                        float eps, float* pre) {
  for (int i = 0; i < n; ++i) pre[i] = sigmoidf(mix[i] * inv_rms * s0 + base[i]) + eps;
}

// mix has n*(n+2) entries: n pre logits, n post logits, n*n comb logits (row i = input stream).
MHC_HD void mhc_coefficients(const float* mix, float inv_rms, const float* scale, const float* base,
                             int n, const MhcScalars& s, float* pre, float* post, float* comb) {
  const float eps = s.hc_sinkhorn_eps;
  const float* logits = mix + 2 * n;
  const float* cbase = base + 2 * n;
  for (int i = 0; i < n; ++i) {  // softmax over j, then + eps
    float* row = comb + i * n;
    float mx = -INFINITY;
    for (int j = 0; j < n; ++j) {
      row[j] = logits[i * n + j] * inv_rms * scale[2] + cbase[i * n + j];
      mx = fmaxf(mx, row[j]);
    }
    float sum = 0.f;
    for (int j = 0; j < n; ++j) {
      row[j] = expf(row[j] - mx);
      sum += row[j];
    }
    for (int j = 0; j < n; ++j) row[j] = row[j] / sum + eps;
  }
  auto normalise_columns = [&]() {
    for (int j = 0; j < n; ++j) {
      float sum = 0.f;
      for (int i = 0; i < n; ++i) sum += comb[i * n + j];
      for (int i = 0; i < n; ++i) comb[i * n + j] /= (sum + eps);
    }
  };
  normalise_columns();
  for (int it = 1; it < s.sinkhorn_iters; ++it) {
    for (int i = 0; i < n; ++i) {
      float sum = 0.f;
      for (int j = 0; j < n; ++j) sum += comb[i * n + j];
      for (int j = 0; j < n; ++j) comb[i * n + j] /= (sum + eps);
    }
    normalise_columns();
  }
  // pre and post last: their values are then never live across the Sinkhorn loop, whose fp32
  // divisions call ptxas's slow-path subroutines (sm_100a kept two of them in a stack frame
  // across those calls). Independent of comb: the same values in any order.
  pre_weights(mix, inv_rms, scale[0], base, n, s.hc_pre_eps, pre);
  for (int j = 0; j < n; ++j)
    post[j] = sigmoidf(mix[n + j] * inv_rms * scale[1] + base[n + j]) * s.hc_post_mult;
}

}  // namespace mhc_sp
