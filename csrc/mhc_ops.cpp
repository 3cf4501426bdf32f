// SPDX-License-Identifier: Apache-2.0
// The mHC math ops: argument checks, output allocation, and a call into the kernel table of the
// tensors' device. One implementation serves the CPU and the CUDA dispatch keys.

#include <c10/core/DeviceGuard.h>

#include "mhc_sp/checks.h"
#include "mhc_sp/kernels.h"
#include "mhc_sp/nvtx.h"
#include "mhc_sp/ops.h"

namespace mhc_sp {
namespace {

const KernelTable& kernels_for(const Tensor& t) {
#if defined(MHC_SP_WITH_CUDA)
  if (t.is_cuda()) return cuda_kernels();
#endif
  TORCH_CHECK_VALUE(t.is_cpu(), "mhc_sp was built without CUDA support; got a tensor on ",
                    t.device());
  return cpu_kernels();
}

struct PreOutputs {
  Tensor post, comb, layer_input;
};

PreOutputs alloc_pre_outputs(const StreamShape& s, const Tensor& ref) {
  const auto f32 = ref.options().dtype(at::kFloat);
  return {at::empty({s.T, s.n}, f32), at::empty({s.T, s.n, s.n}, f32),
          at::empty({s.T, s.H}, ref.options().dtype(at::kBFloat16))};
}

PreParams pre_params(const StreamShape& s, const Tensor& fn, const Tensor& scale,
                     const Tensor& base, const OptTensor& norm_weight, const MhcScalars& sc,
                     PreOutputs& out) {
  return PreParams{s.T,
                   s.n,
                   s.H,
                   base.size(0),
                   fn.const_data_ptr<float>(),
                   scale.const_data_ptr<float>(),
                   base.const_data_ptr<float>(),
                   norm_weight ? norm_weight->const_data_ptr<float>() : nullptr,
                   sc,
                   out.post.defined() ? out.post.data_ptr<float>() : nullptr,
                   out.comb.defined() ? out.comb.data_ptr<float>() : nullptr,
                   out.layer_input.data_ptr<BFloat16>()};
}

PostParams post_params(const StreamShape& s, const Tensor& x, const Tensor& residual,
                       const Tensor& post, const Tensor& comb, Tensor& residual_out) {
  return PostParams{s.T,
                    s.n,
                    s.H,
                    x.const_data_ptr<BFloat16>(),
                    residual.const_data_ptr<BFloat16>(),
                    post.const_data_ptr<float>(),
                    comb.const_data_ptr<float>(),
                    residual_out.data_ptr<BFloat16>()};
}

// x, residual, post, comb of a post (or post + pre): returns the stream shape.
StreamShape check_post_inputs(const Tensor& x, const Tensor& residual, const Tensor& post,
                              const Tensor& comb) {
  const StreamShape s = check_stream(residual, "residual");
  check_hidden(x, "x", s.T, s.H, residual, "residual");
  check_post_comb(post, comb, s, residual, "residual");
  return s;
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> mhc_pre(const Tensor& residual, const Tensor& fn,
                                           const Tensor& hc_scale, const Tensor& hc_base,
                                           const OptTensor& norm_weight, double rms_eps,
                                           double hc_pre_eps, double hc_sinkhorn_eps,
                                           double hc_post_mult, int64_t sinkhorn_iters,
                                           double norm_eps) {
  MHC_SP_NVTX_RANGE("mhc_pre");
  const StreamShape s = check_stream(residual, "residual");
  check_mhc_projection(fn, hc_scale, hc_base, s, residual, "residual");
  const auto w = check_norm_weight(norm_weight, s.H, residual, "residual");
  const MhcScalars sc =
      check_scalars(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps);
  const c10::DeviceGuard guard(residual.device());
  PreOutputs out = alloc_pre_outputs(s, residual);
  if (s.T > 0) {
    kernels_for(residual).mhc_pre(residual.const_data_ptr<BFloat16>(),
                                  pre_params(s, fn, hc_scale, hc_base, w, sc, out));
  }
  return {out.post, out.comb, out.layer_input};
}

Tensor mhc_post(const Tensor& x, const Tensor& residual, const Tensor& post, const Tensor& comb) {
  MHC_SP_NVTX_RANGE("mhc_post");
  const StreamShape s = check_post_inputs(x, residual, post, comb);
  const c10::DeviceGuard guard(residual.device());
  Tensor out = at::empty_like(residual);
  if (s.T > 0) kernels_for(residual).mhc_post(post_params(s, x, residual, post, comb, out));
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> mhc_post_pre(
    const Tensor& x, const Tensor& residual, const Tensor& post, const Tensor& comb,
    const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base, const OptTensor& norm_weight,
    double rms_eps, double hc_pre_eps, double hc_sinkhorn_eps, double hc_post_mult,
    int64_t sinkhorn_iters, double norm_eps) {
  MHC_SP_NVTX_RANGE("mhc_post_pre");
  const StreamShape s = check_post_inputs(x, residual, post, comb);
  check_mhc_projection(fn, hc_scale, hc_base, s, residual, "residual");
  const auto w = check_norm_weight(norm_weight, s.H, residual, "residual");
  const MhcScalars sc =
      check_scalars(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps);
  const c10::DeviceGuard guard(residual.device());
  Tensor residual_out = at::empty_like(residual);
  PreOutputs out = alloc_pre_outputs(s, residual);
  if (s.T > 0) {
    kernels_for(residual).mhc_post_pre(post_params(s, x, residual, post, comb, residual_out),
                                       pre_params(s, fn, hc_scale, hc_base, w, sc, out));
  }
  return {residual_out, out.post, out.comb, out.layer_input};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> mhc_pre_broadcast(
    const Tensor& x, const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base,
    const OptTensor& norm_weight, double rms_eps, double hc_pre_eps, double hc_sinkhorn_eps,
    double hc_post_mult, int64_t sinkhorn_iters, double norm_eps) {
  MHC_SP_NVTX_RANGE("mhc_pre_broadcast");
  TORCH_CHECK_VALUE(x.defined(), "x: expected a tensor, got None");
  check_tensor(x, "x", at::kBFloat16, 2, "(tokens, hidden)", x, "x");
  TORCH_CHECK_VALUE(x.size(1) >= 1, "x: hidden size (dim 1) must be positive, got shape ",
                    shape_str(x));
  check_tensor(fn, "fn", at::kFloat, 2, "(n*(n+2), n * hidden)", x, "x");
  const int64_t H = x.size(1);
  const int64_t n = fn.size(1) / H;
  TORCH_CHECK_VALUE(fn.size(1) % H == 0 && n >= 1 && n <= kMaxHcMult,
                    "fn: expected shape (n*(n+2), n*", H, ") for hc_mult n in [1, ", kMaxHcMult,
                    "] and hidden ", H, " (from x), got ", shape_str(fn));
  const StreamShape s{x.size(0), n, H};
  check_mhc_projection(fn, hc_scale, hc_base, s, x, "x");
  const auto w = check_norm_weight(norm_weight, s.H, x, "x");
  const MhcScalars sc =
      check_scalars(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps);
  const c10::DeviceGuard guard(x.device());
  Tensor residual_out = at::empty({s.T, s.n, s.H}, x.options());
  PreOutputs out = alloc_pre_outputs(s, x);
  if (s.T > 0) {
    // The n streams are identical, so X @ fn^T == x @ (sum over streams of fn)^T.
    const Tensor fn_summed = fn.view({s.mix_rows(), s.n, s.H}).sum(1);
    kernels_for(x).mhc_pre_broadcast(x.const_data_ptr<BFloat16>(),
                                     residual_out.data_ptr<BFloat16>(),
                                     pre_params(s, fn_summed, hc_scale, hc_base, w, sc, out));
  }
  return {residual_out, out.post, out.comb, out.layer_input};
}

Tensor hc_head(const Tensor& residual, const Tensor& fn, const Tensor& hc_scale,
               const Tensor& hc_base, double rms_eps, double hc_eps) {
  MHC_SP_NVTX_RANGE("hc_head");
  const StreamShape s = check_stream(residual, "residual");
  check_projection(fn, "fn", hc_scale, "hc_scale", hc_base, "hc_base", s, s.n,
                   "hc_mult rows for hc_head", 1, residual, "residual");
  // Only rms_eps and hc_eps (as the pre eps) are used by the head's weights.
  const MhcScalars sc = check_scalars(rms_eps, hc_eps, 0.0, 1.0, 1, 1e-6);
  const c10::DeviceGuard guard(residual.device());
  PreOutputs out{Tensor(), Tensor(), at::empty({s.T, s.H}, residual.options())};
  if (s.T > 0) {
    kernels_for(residual).hc_head(residual.const_data_ptr<BFloat16>(),
                                  pre_params(s, fn, hc_scale, hc_base, std::nullopt, sc, out));
  }
  return out.layer_input;
}

}  // namespace mhc_sp
