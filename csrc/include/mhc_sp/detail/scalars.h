// SPDX-License-Identifier: Apache-2.0
#pragma once
// The scalar tail `S` of every mHC op (docs/design.md §1/§2), narrowed to the fp32 the kernels use.

namespace mhc_sp {

// Streams per token are bounded so that per-token coefficient arrays fit in registers / on the
// stack.
constexpr int kMaxHcMult = 8;

struct MhcScalars {
  float rms_eps;
  float hc_pre_eps;
  float hc_sinkhorn_eps;
  float hc_post_mult;
  int sinkhorn_iters;
  float norm_eps;
};

}  // namespace mhc_sp
