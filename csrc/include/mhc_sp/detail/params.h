// SPDX-License-Identifier: Apache-2.0
#pragma once
// The ops' arguments once checked (docs/design.md §2). Each public entry (mhc_sp/ops.h) checks its
// tensors and scalars exactly once, into the structs below; the bodies (mhc_sp/detail/impl.h), the
// composed boundaries and the transports take only these, so no argument is checked twice and no
// op calls another op's entry. The kernel parameter structs (mhc_sp/detail/kernels.h) are built
// from them here, in one place, for every caller: the math ops, the shm and the symm transports.

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "mhc_sp/detail/checks.h"
#include "mhc_sp/detail/kernels.h"
#include "mhc_sp/detail/scalars.h"

namespace mhc_sp {

using OptTensor = std::optional<Tensor>;

// The scalar tail of a pre as the schemas pass it (docs/design.md §2), before its checks: the op
// entries gather it here once and hand it on as one value.
struct ScalarArgs {
  double rms_eps;
  double hc_pre_eps;
  double hc_sinkhorn_eps;
  double hc_post_mult;
  int64_t sinkhorn_iters;
  double norm_eps;
};

// A pre's projection (fn (n(n+2), n*H), hc_scale (3,), hc_base (n(n+2),), fp32), its optional
// RMSNorm weight (fp32, contiguous) and the scalar tail narrowed to fp32.
struct PreWeights {
  Tensor fn, scale, base;
  OptTensor norm_weight;
  MhcScalars s;
};

// hc_head's scalars: only rms_eps and hc_eps (the weights' eps) take part in the head.
struct HeadScalars {
  float rms_eps;
  float hc_eps;
};

// The head's projection (fn (n, n*H), hc_scale (1,), hc_base (n,), fp32) and its scalars.
struct HeadWeights {
  Tensor fn, scale, base;
  HeadScalars s;
};

// The stream a post writes into: residual (rows, n, H) bf16 and the previous pre's post (rows, n)
// and comb (rows, n, n) fp32; `shape` is residual's.
struct PostInputs {
  Tensor residual, post, comb;
  StreamShape shape;
};

// ---- checks (each raises a Python exception naming the argument) --------------------------------

inline MhcScalars check_scalars(const ScalarArgs& a) {
  TORCH_CHECK_VALUE(a.rms_eps > 0, "rms_eps: expected a positive value, got ", a.rms_eps);
  TORCH_CHECK_VALUE(a.norm_eps > 0, "norm_eps: expected a positive value, got ", a.norm_eps);
  TORCH_CHECK_VALUE(a.hc_pre_eps >= 0, "hc_pre_eps: expected a value >= 0, got ", a.hc_pre_eps);
  TORCH_CHECK_VALUE(a.hc_sinkhorn_eps >= 0, "hc_sinkhorn_eps: expected a value >= 0, got ",
                    a.hc_sinkhorn_eps);
  TORCH_CHECK_VALUE(a.sinkhorn_iters >= 1 && a.sinkhorn_iters <= 1000,
                    "sinkhorn_iters: expected a value in [1, 1000], got ", a.sinkhorn_iters);
  return MhcScalars{static_cast<float>(a.rms_eps),         static_cast<float>(a.hc_pre_eps),
                    static_cast<float>(a.hc_sinkhorn_eps), static_cast<float>(a.hc_post_mult),
                    static_cast<int>(a.sinkhorn_iters),    static_cast<float>(a.norm_eps)};
}

inline HeadScalars check_head_scalars(double rms_eps, double hc_eps) {
  TORCH_CHECK_VALUE(rms_eps > 0, "rms_eps: expected a positive value, got ", rms_eps);
  TORCH_CHECK_VALUE(hc_eps >= 0, "hc_eps: expected a value >= 0, got ", hc_eps);
  return HeadScalars{static_cast<float>(rms_eps), static_cast<float>(hc_eps)};
}

// fn, hc_scale, hc_base, norm_weight and the scalar tail of a pre on the stream `s`, whose device
// is `ref`'s (named `ref_name` in errors).
inline PreWeights check_pre_weights(const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base,
                                    const OptTensor& norm_weight, const StreamShape& s,
                                    const Tensor& ref, const char* ref_name,
                                    const ScalarArgs& scalars) {
  check_mhc_projection(fn, hc_scale, hc_base, s, ref, ref_name);
  OptTensor w = check_norm_weight(norm_weight, s.H, ref, ref_name);
  return PreWeights{fn, hc_scale, hc_base, std::move(w), check_scalars(scalars)};
}

// The stream shape of a broadcast pre of x (tokens, hidden), a checked bf16 tensor, over `rows`
// rows: the hidden size from x, the stream count n from fn (n(n+2), n*H).
inline StreamShape check_broadcast_shape(const Tensor& x, const Tensor& fn, int64_t rows) {
  const int64_t H = x.size(1);
  TORCH_CHECK_VALUE(H >= 1, "x: hidden size (dim 1) must be positive, got shape ", shape_str(x));
  check_tensor(fn, "fn", at::kFloat, 2, "(n*(n+2), n * hidden)", x, "x");
  const int64_t n = fn.size(1) / H;
  TORCH_CHECK_VALUE(fn.size(1) % H == 0 && n >= 1 && n <= kMaxHcMult,
                    "fn: expected shape (n*(n+2), n*", H, ") for hc_mult n in [1, ", kMaxHcMult,
                    "] and hidden ", H, " (from x), got ", shape_str(fn));
  return StreamShape{rows, n, H};
}

// ---- kernel parameters, built in one place ------------------------------------------------------

// The n streams of a broadcast pre are identical, so X @ fn^T == x @ (sum over streams of fn)^T:
// the same weights with fn summed over its streams, (n(n+2), H).
inline PreWeights broadcast_weights(const PreWeights& w, const StreamShape& s) {
  PreWeights summed = w;
  summed.fn = w.fn.view({s.mix_rows(), s.n, s.H}).sum(1);
  return summed;
}

// A projection of `T` rows of the stream shape `s` through fn / scale / base (its rows: base's).
inline PreParams projection_params(const Tensor& fn, const Tensor& scale, const Tensor& base,
                                   const float* norm_weight, const MhcScalars& sc, int64_t T,
                                   const StreamShape& s, float* post, float* comb, BFloat16* out) {
  return PreParams{.T = T,
                   .n = s.n,
                   .H = s.H,
                   .rows = base.size(0),
                   .fn = fn.const_data_ptr<float>(),
                   .scale = scale.const_data_ptr<float>(),
                   .base = base.const_data_ptr<float>(),
                   .norm_weight = norm_weight,
                   .s = sc,
                   .post = post,
                   .comb = comb,
                   .out = out};
}

// A pre over `T` rows of the stream shape `s`, writing post (T, n), comb (T, n, n) and out (T, H).
inline PreParams pre_kernel_params(const PreWeights& w, int64_t T, const StreamShape& s,
                                   float* post, float* comb, BFloat16* out) {
  const float* norm = w.norm_weight ? w.norm_weight->const_data_ptr<float>() : nullptr;
  return projection_params(w.fn, w.scale, w.base, norm, w.s, T, s, post, comb, out);
}

// The head's collapse over `T` rows into out (T, H): a pre with n rows, no post/comb, no norm;
// of the scalar tail only rms_eps and the weights' eps (hc_eps) take part.
inline PreParams head_kernel_params(const HeadWeights& w, int64_t T, const StreamShape& s,
                                    BFloat16* out) {
  const MhcScalars sc{.rms_eps = w.s.rms_eps,
                      .hc_pre_eps = w.s.hc_eps,
                      .hc_sinkhorn_eps = 0.f,
                      .hc_post_mult = 1.f,
                      .sinkhorn_iters = 1,
                      .norm_eps = 1e-6f};
  return projection_params(w.fn, w.scale, w.base, nullptr, sc, T, s, nullptr, nullptr, out);
}

// A post over `T` rows of `in` with x from `x`, into residual_out (T, n, H).
inline PostParams post_kernel_params(const PostInputs& in, int64_t T, const XSource& x,
                                     BFloat16* residual_out) {
  return PostParams{.T = T,
                    .n = in.shape.n,
                    .H = in.shape.H,
                    .x = x,
                    .residual = in.residual.const_data_ptr<BFloat16>(),
                    .post = in.post.const_data_ptr<float>(),
                    .comb = in.comb.const_data_ptr<float>(),
                    .residual_out = residual_out};
}

}  // namespace mhc_sp
