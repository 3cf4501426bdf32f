#pragma once
// The mHC math ops (DESIGN §1/§2) as C++ functions, device-generic: they validate, allocate and
// run the kernel table of the tensors' device. The fused SP ops call them on token shards.

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace mhc_sp {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

std::tuple<Tensor, Tensor, Tensor> mhc_pre(const Tensor& residual, const Tensor& fn,
                                           const Tensor& hc_scale, const Tensor& hc_base,
                                           const OptTensor& norm_weight, double rms_eps,
                                           double hc_pre_eps, double hc_sinkhorn_eps,
                                           double hc_post_mult, int64_t sinkhorn_iters,
                                           double norm_eps);

Tensor mhc_post(const Tensor& x, const Tensor& residual, const Tensor& post, const Tensor& comb);

std::tuple<Tensor, Tensor, Tensor, Tensor> mhc_post_pre(
    const Tensor& x, const Tensor& residual, const Tensor& post, const Tensor& comb,
    const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base, const OptTensor& norm_weight,
    double rms_eps, double hc_pre_eps, double hc_sinkhorn_eps, double hc_post_mult,
    int64_t sinkhorn_iters, double norm_eps);

std::tuple<Tensor, Tensor, Tensor, Tensor> mhc_pre_broadcast(
    const Tensor& x, const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base,
    const OptTensor& norm_weight, double rms_eps, double hc_pre_eps, double hc_sinkhorn_eps,
    double hc_post_mult, int64_t sinkhorn_iters, double norm_eps);

Tensor hc_head(const Tensor& residual, const Tensor& fn, const Tensor& hc_scale,
               const Tensor& hc_base, double rms_eps, double hc_eps);

}  // namespace mhc_sp
