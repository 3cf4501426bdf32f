// SPDX-License-Identifier: Apache-2.0
#pragma once
// Argument checks shared by every op and backend. Each failure raises a Python exception
// (TypeError for dtypes, ValueError otherwise) whose message starts with the argument's name.

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "mhc_sp/detail/scalars.h"

namespace mhc_sp {

using at::Tensor;

inline std::string shape_str(const Tensor& t) { return c10::str(t.sizes()); }

inline void check_dtype(const Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, ": expected dtype ", dtype, ", got ",
                   t.scalar_type());
}

inline void check_dim(const Tensor& t, const char* name, int64_t dim, const char* layout) {
  TORCH_CHECK_VALUE(t.dim() == dim, name, ": expected a ", dim, "-d tensor ", layout,
                    ", got shape ", shape_str(t));
}

inline void check_contiguous(const Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.is_contiguous(), name, ": expected a contiguous tensor (shape ", shape_str(t),
                    ", strides ", t.strides(), ")");
}

inline void check_device(const Tensor& t, const char* name, const Tensor& ref,
                         const char* ref_name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), name, ": expected a tensor on ", ref.device(),
                    " (the device of ", ref_name, "), got ", t.device());
}

inline void check_size(const Tensor& t, const char* name, int64_t dim, int64_t expected,
                       const char* what) {
  TORCH_CHECK_VALUE(t.size(dim) == expected, name, ": expected size ", expected, " at dim ", dim,
                    " (", what, "), got shape ", shape_str(t));
}

// dtype + rank + contiguity + device in one call; the common case for every tensor argument.
inline void check_tensor(const Tensor& t, const char* name, at::ScalarType dtype, int64_t dim,
                         const char* layout, const Tensor& ref, const char* ref_name) {
  TORCH_CHECK_VALUE(t.defined(), name, ": expected a tensor, got None");
  check_device(t, name, ref, ref_name);
  check_dtype(t, name, dtype);
  check_dim(t, name, dim, layout);
  check_contiguous(t, name);
}

struct StreamShape {
  int64_t T;  // tokens (rows)
  int64_t n;  // hc_mult, streams per token
  int64_t H;  // hidden size
  int64_t mix_rows() const { return n * (n + 2); }
};

// A residual stream (T, n, H) bf16; it fixes the device every other argument must share.
inline StreamShape check_stream(const Tensor& residual, const char* name) {
  TORCH_CHECK_VALUE(residual.defined(), name, ": expected a tensor, got None");
  TORCH_CHECK_VALUE(residual.device().is_cpu() || residual.device().is_cuda(), name,
                    ": expected a cpu or cuda tensor, got ", residual.device());
  check_dtype(residual, name, at::kBFloat16);
  check_dim(residual, name, 3, "(tokens, hc_mult, hidden)");
  check_contiguous(residual, name);
  const StreamShape s{residual.size(0), residual.size(1), residual.size(2)};
  TORCH_CHECK_VALUE(s.n >= 1 && s.n <= kMaxHcMult, name, ": hc_mult (dim 1) must be in [1, ",
                    kMaxHcMult, "], got shape ", shape_str(residual));
  TORCH_CHECK_VALUE(s.H >= 1, name, ": hidden size (dim 2) must be positive, got shape ",
                    shape_str(residual));
  return s;
}

// A hidden state (T, H) bf16: x, partial, layer_input.
inline void check_hidden(const Tensor& x, const char* name, int64_t T, int64_t H, const Tensor& ref,
                         const char* ref_name) {
  check_tensor(x, name, at::kBFloat16, 2, "(tokens, hidden)", ref, ref_name);
  check_size(x, name, 0, T, "tokens");
  check_size(x, name, 1, H, "hidden");
}

// post (T, n) and comb (T, n, n) fp32 coefficients produced by a previous pre.
inline void check_post_comb(const Tensor& post, const Tensor& comb, const StreamShape& s,
                            const Tensor& ref, const char* ref_name) {
  check_tensor(post, "post", at::kFloat, 2, "(tokens, hc_mult)", ref, ref_name);
  check_size(post, "post", 0, s.T, "tokens");
  check_size(post, "post", 1, s.n, "hc_mult");
  check_tensor(comb, "comb", at::kFloat, 3, "(tokens, hc_mult, hc_mult)", ref, ref_name);
  check_size(comb, "comb", 0, s.T, "tokens");
  check_size(comb, "comb", 1, s.n, "hc_mult");
  check_size(comb, "comb", 2, s.n, "hc_mult");
}

// fn (rows, n*H) fp32, hc_scale (scale_len,) fp32, hc_base (rows,) fp32. `rows` is n(n+2) for the
// mHC pre and n for hc_head; names are passed so fused ops can report head_fn etc.
inline void check_projection(const Tensor& fn, const char* fn_name, const Tensor& scale,
                             const char* scale_name, const Tensor& base, const char* base_name,
                             const StreamShape& s, int64_t rows, const char* rows_what,
                             int64_t scale_len, const Tensor& ref, const char* ref_name) {
  check_tensor(fn, fn_name, at::kFloat, 2, "(rows, hc_mult * hidden)", ref, ref_name);
  check_size(fn, fn_name, 0, rows, rows_what);
  check_size(fn, fn_name, 1, s.n * s.H, "hc_mult * hidden");
  check_tensor(scale, scale_name, at::kFloat, 1, "(scales,)", ref, ref_name);
  check_size(scale, scale_name, 0, scale_len, "number of scales");
  check_tensor(base, base_name, at::kFloat, 1, "(rows,)", ref, ref_name);
  check_size(base, base_name, 0, rows, rows_what);
}

inline void check_mhc_projection(const Tensor& fn, const Tensor& scale, const Tensor& base,
                                 const StreamShape& s, const Tensor& ref, const char* ref_name) {
  check_projection(fn, "fn", scale, "hc_scale", base, "hc_base", s, s.mix_rows(),
                   "n*(n+2) mix rows for hc_mult n", 3, ref, ref_name);
}

// norm_weight (H,) in bf16 or fp32; returns it as contiguous fp32 (or nullopt).
inline std::optional<Tensor> check_norm_weight(const std::optional<Tensor>& w, int64_t H,
                                               const Tensor& ref, const char* ref_name) {
  if (!w.has_value() || !w->defined()) return std::nullopt;
  check_device(*w, "norm_weight", ref, ref_name);
  TORCH_CHECK_TYPE(w->scalar_type() == at::kBFloat16 || w->scalar_type() == at::kFloat,
                   "norm_weight: expected dtype bfloat16 or float32, got ", w->scalar_type());
  check_dim(*w, "norm_weight", 1, "(hidden,)");
  check_size(*w, "norm_weight", 0, H, "hidden");
  return w->to(at::kFloat).contiguous();
}

}  // namespace mhc_sp
