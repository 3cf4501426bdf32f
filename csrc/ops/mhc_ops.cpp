// SPDX-License-Identifier: Apache-2.0
// The mHC math ops: each entry checks its arguments once (mhc_sp/detail/params.h) and runs its
// body, which allocates the outputs and calls the kernel table of the tensors' device. One
// implementation serves the CPU and the CUDA dispatch keys.

#include <c10/core/DeviceGuard.h>

#include "mhc_sp/detail/impl.h"
#include "mhc_sp/detail/nvtx.h"
#include "mhc_sp/ops.h"

namespace mhc_sp {
namespace {

const KernelTable& kernels_for(const Tensor& t) {
#if defined(MHC_SP_EMULATION)
  // The emulated device (csrc/emulation/): host memory, the CUDA kernels.
  TORCH_CHECK_VALUE(t.is_cpu(), "the emulated device takes CPU tensors; got a tensor on ",
                    t.device());
  return cuda_kernels();
#else
#if defined(MHC_SP_WITH_CUDA)
  if (t.is_cuda()) return cuda_kernels();
#endif
  TORCH_CHECK_VALUE(t.is_cpu(), "mhc_sp was built without CUDA support; got a tensor on ",
                    t.device());
  return cpu_kernels();
#endif
}

PreOutputs alloc_pre_outputs(const StreamShape& s, const Tensor& ref) {
  const auto f32 = ref.options().dtype(at::kFloat);
  return {at::empty({s.T, s.n}, f32), at::empty({s.T, s.n, s.n}, f32),
          at::empty({s.T, s.H}, ref.options().dtype(at::kBFloat16))};
}

PreParams pre_params_into(const PreWeights& w, const StreamShape& s, PreOutputs& out) {
  return pre_kernel_params(w, s.T, s, out.post.data_ptr<float>(), out.comb.data_ptr<float>(),
                           out.layer_input.data_ptr<BFloat16>());
}

// x, residual, post, comb of a post (or post + pre), checked.
PostInputs check_post_inputs(const Tensor& x, const Tensor& residual, const Tensor& post,
                             const Tensor& comb) {
  const StreamShape s = check_stream(residual, "residual");
  check_hidden(x, "x", s.T, s.H, residual, "residual");
  check_post_comb(post, comb, s, residual, "residual");
  return PostInputs{residual, post, comb, s};
}

}  // namespace

// ---- bodies -------------------------------------------------------------------------------------

PreOutputs mhc_pre_impl(const Tensor& residual, const StreamShape& s, const PreWeights& w) {
  PreOutputs out = alloc_pre_outputs(s, residual);
  if (s.T > 0) {
    kernels_for(residual).mhc_pre(residual.const_data_ptr<BFloat16>(), pre_params_into(w, s, out));
  }
  return out;
}

Tensor mhc_post_impl(const Tensor& x, const PostInputs& in) {
  Tensor out = at::empty_like(in.residual);
  if (in.shape.T > 0) {
    kernels_for(in.residual)
        .mhc_post(post_kernel_params(in, in.shape.T, XSource::direct(x.const_data_ptr<BFloat16>()),
                                     out.data_ptr<BFloat16>()));
  }
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> mhc_post_pre_impl(const Tensor& x, const PostInputs& in,
                                                             const PreWeights& w) {
  const StreamShape& s = in.shape;
  Tensor residual_out = at::empty_like(in.residual);
  PreOutputs out = alloc_pre_outputs(s, in.residual);
  if (s.T > 0) {
    kernels_for(in.residual)
        .mhc_post_pre(post_kernel_params(in, s.T, XSource::direct(x.const_data_ptr<BFloat16>()),
                                         residual_out.data_ptr<BFloat16>()),
                      pre_params_into(w, s, out));
  }
  return {residual_out, out.post, out.comb, out.layer_input};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> mhc_pre_broadcast_impl(const Tensor& x,
                                                                  const StreamShape& s,
                                                                  const PreWeights& w) {
  Tensor residual_out = at::empty({s.T, s.n, s.H}, x.options());
  PreOutputs out = alloc_pre_outputs(s, x);
  if (s.T > 0) {
    kernels_for(x).mhc_pre_broadcast(x.const_data_ptr<BFloat16>(),
                                     residual_out.data_ptr<BFloat16>(),
                                     pre_params_into(broadcast_weights(w, s), s, out));
  }
  return {residual_out, out.post, out.comb, out.layer_input};
}

Tensor hc_head_impl(const Tensor& residual, const StreamShape& s, const HeadWeights& w) {
  Tensor out = at::empty({s.T, s.H}, residual.options());
  if (s.T > 0) {
    kernels_for(residual).hc_head(residual.const_data_ptr<BFloat16>(),
                                  head_kernel_params(w, s.T, s, out.data_ptr<BFloat16>()));
  }
  return out;
}

// ---- entries ------------------------------------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor> mhc_pre(const Tensor& residual, const Tensor& fn,
                                           const Tensor& hc_scale, const Tensor& hc_base,
                                           const OptTensor& norm_weight, double rms_eps,
                                           double hc_pre_eps, double hc_sinkhorn_eps,
                                           double hc_post_mult, int64_t sinkhorn_iters,
                                           double norm_eps) {
  MHC_SP_NVTX_RANGE("mhc_pre");
  const StreamShape s = check_stream(residual, "residual");
  const PreWeights w = check_pre_weights(
      fn, hc_scale, hc_base, norm_weight, s, residual, "residual",
      {rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps});
  const c10::DeviceGuard guard(residual.device());
  PreOutputs out = mhc_pre_impl(residual, s, w);
  return {out.post, out.comb, out.layer_input};
}

Tensor mhc_post(const Tensor& x, const Tensor& residual, const Tensor& post, const Tensor& comb) {
  MHC_SP_NVTX_RANGE("mhc_post");
  const PostInputs in = check_post_inputs(x, residual, post, comb);
  const c10::DeviceGuard guard(residual.device());
  return mhc_post_impl(x, in);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> mhc_post_pre(
    const Tensor& x, const Tensor& residual, const Tensor& post, const Tensor& comb,
    const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base, const OptTensor& norm_weight,
    double rms_eps, double hc_pre_eps, double hc_sinkhorn_eps, double hc_post_mult,
    int64_t sinkhorn_iters, double norm_eps) {
  MHC_SP_NVTX_RANGE("mhc_post_pre");
  const PostInputs in = check_post_inputs(x, residual, post, comb);
  const PreWeights w = check_pre_weights(
      fn, hc_scale, hc_base, norm_weight, in.shape, residual, "residual",
      {rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps});
  const c10::DeviceGuard guard(residual.device());
  return mhc_post_pre_impl(x, in, w);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> mhc_pre_broadcast(
    const Tensor& x, const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base,
    const OptTensor& norm_weight, double rms_eps, double hc_pre_eps, double hc_sinkhorn_eps,
    double hc_post_mult, int64_t sinkhorn_iters, double norm_eps) {
  MHC_SP_NVTX_RANGE("mhc_pre_broadcast");
  TORCH_CHECK_VALUE(x.defined(), "x: expected a tensor, got None");
  check_tensor(x, "x", at::kBFloat16, 2, "(tokens, hidden)", x, "x");
  const StreamShape s = check_broadcast_shape(x, fn, x.size(0));
  const PreWeights w = check_pre_weights(
      fn, hc_scale, hc_base, norm_weight, s, x, "x",
      {rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps});
  const c10::DeviceGuard guard(x.device());
  return mhc_pre_broadcast_impl(x, s, w);
}

Tensor hc_head(const Tensor& residual, const Tensor& fn, const Tensor& hc_scale,
               const Tensor& hc_base, double rms_eps, double hc_eps) {
  MHC_SP_NVTX_RANGE("hc_head");
  const StreamShape s = check_stream(residual, "residual");
  check_projection(fn, "fn", hc_scale, "hc_scale", hc_base, "hc_base", s, s.n,
                   "hc_mult rows for hc_head", 1, residual, "residual");
  const HeadWeights w{fn, hc_scale, hc_base, check_head_scalars(rms_eps, hc_eps)};
  const c10::DeviceGuard guard(residual.device());
  return hc_head_impl(residual, s, w);
}

}  // namespace mhc_sp
