// SPDX-License-Identifier: Apache-2.0
#pragma once
// Every op of docs/design.md §2 as a C++ function, device-generic: the public entries, and the only
// functions registration.cpp binds. Each checks its arguments once (mhc_sp/detail/params.h) and
// runs its body (mhc_sp/detail/impl.h): the math ops (csrc/ops/mhc_ops.cpp) the kernel table of the
// tensors' device, the collectives and fused SP ops (csrc/ops/sp_ops.cpp) the group's transport or
// the composition of its collectives with the math bodies.

#include <ATen/ATen.h>

#include <optional>
#include <string>
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

Tensor shard_tokens(const Tensor& x, int64_t rank, int64_t world_size);
Tensor all_gather(const Tensor& x, const std::string& group, int64_t num_tokens);
Tensor reduce_scatter(const Tensor& x, const std::string& group);
Tensor all_reduce(const Tensor& x, const std::string& group);

std::tuple<Tensor, Tensor, Tensor, Tensor> fused_entry(
    const Tensor& x, const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base,
    const OptTensor& norm_weight, const std::string& group, bool sharded, double rms_eps,
    double hc_pre_eps, double hc_sinkhorn_eps, double hc_post_mult, int64_t sinkhorn_iters,
    double norm_eps);

std::tuple<Tensor, Tensor, Tensor, Tensor> fused_layer(
    const Tensor& partial, const Tensor& residual, const Tensor& post, const Tensor& comb,
    const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base, const OptTensor& norm_weight,
    const std::string& group, bool sharded, int64_t num_tokens, double rms_eps, double hc_pre_eps,
    double hc_sinkhorn_eps, double hc_post_mult, int64_t sinkhorn_iters, double norm_eps);

std::tuple<Tensor, Tensor> fused_head(const Tensor& partial, const Tensor& residual,
                                      const Tensor& post, const Tensor& comb, const Tensor& head_fn,
                                      const Tensor& head_scale, const Tensor& head_base,
                                      const std::string& group, bool sharded, int64_t num_tokens,
                                      double rms_eps, double hc_eps);

}  // namespace mhc_sp
