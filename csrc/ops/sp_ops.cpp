// SPDX-License-Identifier: Apache-2.0
// Sequence-parallel collectives and the fused boundary ops (docs/design.md §2). Device-generic:
// every argument is checked once here, at the entry; then a transport that runs whole boundaries
// in one pass (CPU shm, CUDA symm) takes the fused op, and otherwise the op is composed from the
// group's collectives (gloo for CPU tensors, NCCL on the current stream for CUDA tensors) and the
// math ops' bodies (mhc_sp/detail/impl.h), as it is for a call the fused transport declines (the
// symm transport takes only the fused_layer calls its kernels fit): the composed path lives here
// only, and no transport calls back into the ops. Nothing here synchronises with the host on CUDA.

#include <c10/core/DeviceGuard.h>

#include "mhc_sp/comm.h"
#include "mhc_sp/detail/impl.h"
#include "mhc_sp/detail/nvtx.h"
#include "mhc_sp/detail/shard.h"
#include "mhc_sp/ops.h"

namespace mhc_sp {
namespace {

void check_rows_tensor(const Tensor& x, const char* name) {
  TORCH_CHECK_VALUE(x.defined(), name, ": expected a tensor, got None");
  TORCH_CHECK_VALUE(x.dim() >= 1, name, ": expected at least 1 dim (tokens first), got a scalar");
  check_contiguous(x, name);
}

// x's first `rows` rows, zero-padded to `padded_rows` (a view when no padding is needed).
Tensor pad_rows(const Tensor& x, int64_t rows, int64_t padded_rows) {
  Tensor head = x.narrow(0, 0, rows);
  if (rows == padded_rows) return head;
  auto sizes = x.sizes().vec();
  sizes[0] = padded_rows;
  Tensor out = at::empty(sizes, x.options());
  out.narrow(0, 0, rows).copy_(head);
  out.narrow(0, rows, padded_rows - rows).zero_();
  return out;
}

// Sum of every rank's x[:rows] (zero-padded to world * shard rows), this rank's shard of it.
Tensor reduce_scatter_rows(const Tensor& x, int64_t rows, const GroupHandle& g) {
  const int64_t shard = shard_rows(rows, g.world);
  if (g.world == 1) return x.narrow(0, 0, rows);
  Tensor in = pad_rows(x, rows, shard * g.world);
  auto sizes = x.sizes().vec();
  sizes[0] = shard;
  Tensor out = at::empty(sizes, x.options());
  g.comm->reduce_scatter(out, in);
  return out;
}

Tensor all_reduce_rows(const Tensor& x, int64_t rows, const GroupHandle& g) {
  Tensor in = x.narrow(0, 0, rows);
  if (g.world == 1) return in;
  Tensor out = at::empty_like(in);
  g.comm->all_reduce(out, in);
  return out;
}

// Every rank's x (rows, ...) concatenated, first num_tokens rows kept (-1: all).
Tensor all_gather_rows(const Tensor& x, int64_t num_tokens, const GroupHandle& g) {
  const int64_t total = x.size(0) * g.world;
  const int64_t keep = num_tokens < 0 ? total : num_tokens;
  if (g.world == 1) return x.narrow(0, 0, keep);
  auto sizes = x.sizes().vec();
  sizes[0] = total;
  Tensor out = at::empty(sizes, x.options());
  g.comm->all_gather(out, x);
  return keep == total ? out : out.narrow(0, 0, keep);
}

void check_num_tokens(int64_t num_tokens, int64_t available, const char* rows_of) {
  TORCH_CHECK_VALUE(num_tokens >= 0 && num_tokens <= available,
                    "num_tokens: expected a value in [0, ", available, "] (rows of ", rows_of,
                    "), got ", num_tokens);
}

// The checks fused_layer and fused_head share: the stream, the partial against it, num_tokens,
// the group, the stream's rows (this rank's shard when sharded, all tokens otherwise) and the
// coefficients of the previous pre.
std::pair<PostInputs, GroupHandle> check_boundary(const Tensor& partial, const Tensor& residual,
                                                  const Tensor& post, const Tensor& comb,
                                                  const std::string& group, bool sharded,
                                                  int64_t num_tokens) {
  const StreamShape s = check_stream(residual, "residual");
  check_tensor(partial, "partial", at::kBFloat16, 2, "(tokens, hidden)", residual, "residual");
  check_size(partial, "partial", 1, s.H, "hidden");
  check_num_tokens(num_tokens, partial.size(0), "partial");
  const GroupHandle g = group_for(group, partial, "partial");
  const int64_t expected = sharded ? shard_rows(num_tokens, g.world) : num_tokens;
  TORCH_CHECK_VALUE(
      s.T == expected, "residual: expected ", expected, " rows (",
      sharded ? "this rank's shard: ceil(num_tokens / world) = ceil(" : "num_tokens = ", num_tokens,
      sharded ? c10::str(" / ", g.world, ")") : std::string(), "), got shape ",
      shape_str(residual));
  check_post_comb(post, comb, s, residual, "residual");
  return {PostInputs{residual, post, comb, s}, g};
}

// The reduced sublayer output this rank posts into its stream rows. Rows past num_tokens are
// ignored (treated as zero) so the stream's padding rows stay zero.
Tensor reduce_partial(const Tensor& partial, bool sharded, int64_t num_tokens,
                      const GroupHandle& g) {
  return sharded ? reduce_scatter_rows(partial, num_tokens, g)
                 : all_reduce_rows(partial, num_tokens, g);
}

// Rows of this rank's stream past its real tokens: zeros (docs/design.md §2), whatever the math
// made of them.
void zero_padding_rows(std::initializer_list<Tensor> outputs, bool sharded, int64_t num_tokens,
                       const GroupHandle& g) {
  if (!sharded) return;
  const int64_t valid = shard_valid_rows(num_tokens, g.world, g.rank);
  for (Tensor t : outputs) {
    if (valid < t.size(0)) t.narrow(0, valid, t.size(0) - valid).zero_();
  }
}

// reduce_scatter / all_reduce over all rows of x. A world of one returns a copy: the ops never
// alias their input.
Tensor summing_collective(const Tensor& x, const std::string& group,
                          Tensor (*rows_op)(const Tensor&, int64_t, const GroupHandle&)) {
  check_rows_tensor(x, "x");
  const GroupHandle g = group_for(group, x, "x");
  const c10::DeviceGuard guard(x.device());
  Tensor out = rows_op(x, x.size(0), g);
  return g.world == 1 ? out.clone() : out;
}

// The fused boundaries composed from the group's collectives and the math ops' bodies.

EntryOutputs composed_fused_entry(const EntryArgs& a, const GroupHandle& g) {
  const int64_t T = a.x.size(0);
  const bool split = a.sharded && g.world > 1;
  auto [residual, post, comb, layer_input] = [&] {
    MHC_SP_NVTX_PHASE("fused_entry/pre");
    const Tensor own = split ? shard_tokens_impl(a.x, g.rank, g.world) : a.x;
    return mhc_pre_broadcast_impl(own, a.stream, a.pre);  // own has a.stream.T rows
  }();
  if (split) {
    zero_padding_rows({residual, post, comb}, a.sharded, T, g);
    MHC_SP_NVTX_PHASE("fused_entry/gather");
    layer_input = all_gather_rows(layer_input, T, g).contiguous();
  }
  return {residual, post, comb, layer_input};
}

LayerOutputs composed_fused_layer(const LayerArgs& a, const GroupHandle& g) {
  const Tensor x = [&] {
    MHC_SP_NVTX_PHASE("fused_layer/reduce");
    return reduce_partial(a.partial, a.sharded, a.num_tokens, g);
  }();
  auto [residual_out, post_out, comb_out, layer_input] = [&] {
    MHC_SP_NVTX_PHASE("fused_layer/post_pre");
    return mhc_post_pre_impl(x, a.in, a.pre);
  }();
  if (a.sharded && g.world > 1) {
    zero_padding_rows({residual_out, post_out, comb_out}, a.sharded, a.num_tokens, g);
    MHC_SP_NVTX_PHASE("fused_layer/gather");
    layer_input = all_gather_rows(layer_input, a.num_tokens, g).contiguous();
  }
  return {residual_out, post_out, comb_out, layer_input};
}

HeadOutputs composed_fused_head(const HeadArgs& a, const GroupHandle& g) {
  const Tensor x = [&] {
    MHC_SP_NVTX_PHASE("fused_head/reduce");
    return reduce_partial(a.partial, a.sharded, a.num_tokens, g);
  }();
  auto [residual_out, hidden] = [&] {
    MHC_SP_NVTX_PHASE("fused_head/post_head");
    Tensor stream = mhc_post_impl(x, a.in);
    Tensor collapsed = hc_head_impl(stream, a.in.shape, a.head);
    return std::make_tuple(stream, collapsed);
  }();
  if (a.sharded && g.world > 1) {
    zero_padding_rows({residual_out}, a.sharded, a.num_tokens, g);
    MHC_SP_NVTX_PHASE("fused_head/gather");
    hidden = all_gather_rows(hidden, a.num_tokens, g).contiguous();
  }
  return {hidden, residual_out};
}

// The transport's one-pass boundary (`run`) when it has one and takes the call, else `composed`.
template <typename Outputs, typename Args>
Outputs fused_or_composed(const GroupHandle& g, const Args& args,
                          std::optional<Outputs> (FusedBoundary::*run)(const Args&),
                          Outputs (*composed)(const Args&, const GroupHandle&)) {
  if (FusedBoundary* fused = g.comm ? g.comm->fused() : nullptr) {
    if (std::optional<Outputs> out = (fused->*run)(args)) return std::move(*out);
  }
  return composed(args, g);
}

}  // namespace

Tensor shard_tokens_impl(const Tensor& x, int64_t rank, int64_t world_size) {
  const int64_t rows = shard_rows(x.size(0), world_size);
  const int64_t begin = std::min(rank * rows, x.size(0));
  const int64_t real = std::min(rows, x.size(0) - begin);
  auto sizes = x.sizes().vec();
  sizes[0] = rows;
  Tensor out = at::empty(sizes, x.options());
  out.narrow(0, 0, real).copy_(x.narrow(0, begin, real));
  out.narrow(0, real, rows - real).zero_();
  return out;
}

Tensor shard_tokens(const Tensor& x, int64_t rank, int64_t world_size) {
  MHC_SP_NVTX_RANGE("shard_tokens");
  check_rows_tensor(x, "x");
  TORCH_CHECK_VALUE(world_size >= 1, "world_size: expected a value >= 1, got ", world_size);
  TORCH_CHECK_VALUE(rank >= 0 && rank < world_size, "rank: expected a value in [0, ", world_size,
                    "), got ", rank);
  const c10::DeviceGuard guard(x.device());
  return shard_tokens_impl(x, rank, world_size);
}

Tensor all_gather(const Tensor& x, const std::string& group, int64_t num_tokens) {
  MHC_SP_NVTX_RANGE("all_gather");
  check_rows_tensor(x, "x");
  const GroupHandle g = group_for(group, x, "x");
  TORCH_CHECK_VALUE(num_tokens >= -1 && num_tokens <= x.size(0) * g.world,
                    "num_tokens: expected -1 or a value in [0, ", x.size(0) * g.world,
                    "] (world * rows of x), got ", num_tokens);
  const c10::DeviceGuard guard(x.device());
  Tensor out = all_gather_rows(x, num_tokens, g);
  return g.world == 1 ? out.clone() : out.contiguous();
}

Tensor reduce_scatter(const Tensor& x, const std::string& group) {
  MHC_SP_NVTX_RANGE("reduce_scatter");
  return summing_collective(x, group, reduce_scatter_rows);
}

Tensor all_reduce(const Tensor& x, const std::string& group) {
  MHC_SP_NVTX_RANGE("all_reduce");
  return summing_collective(x, group, all_reduce_rows);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> fused_entry(
    const Tensor& x, const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base,
    const OptTensor& norm_weight, const std::string& group, bool sharded, double rms_eps,
    double hc_pre_eps, double hc_sinkhorn_eps, double hc_post_mult, int64_t sinkhorn_iters,
    double norm_eps) {
  MHC_SP_NVTX_RANGE("fused_entry");
  check_tensor(x, "x", at::kBFloat16, 2, "(tokens, hidden)", x, "x");
  const GroupHandle g = group_for(group, x, "x");
  // The broadcast pre's own checks, made before any rank exchanges anything.
  const int64_t T = x.size(0);
  const StreamShape rows = check_broadcast_shape(x, fn, sharded ? shard_rows(T, g.world) : T);
  const PreWeights w = check_pre_weights(
      fn, hc_scale, hc_base, norm_weight, rows, x, "x",
      {rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps});
  const c10::DeviceGuard guard(x.device());
  const EntryArgs args{x, w, rows, sharded};
  return fused_or_composed(g, args, &FusedBoundary::fused_entry, composed_fused_entry);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> fused_layer(
    const Tensor& partial, const Tensor& residual, const Tensor& post, const Tensor& comb,
    const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base, const OptTensor& norm_weight,
    const std::string& group, bool sharded, int64_t num_tokens, double rms_eps, double hc_pre_eps,
    double hc_sinkhorn_eps, double hc_post_mult, int64_t sinkhorn_iters, double norm_eps) {
  MHC_SP_NVTX_RANGE("fused_layer");
  const auto [in, g] = check_boundary(partial, residual, post, comb, group, sharded, num_tokens);
  const PreWeights w = check_pre_weights(
      fn, hc_scale, hc_base, norm_weight, in.shape, residual, "residual",
      {rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps});
  const c10::DeviceGuard guard(residual.device());
  const LayerArgs args{partial, in, w, sharded, num_tokens};
  return fused_or_composed(g, args, &FusedBoundary::fused_layer, composed_fused_layer);
}

std::tuple<Tensor, Tensor> fused_head(const Tensor& partial, const Tensor& residual,
                                      const Tensor& post, const Tensor& comb, const Tensor& head_fn,
                                      const Tensor& head_scale, const Tensor& head_base,
                                      const std::string& group, bool sharded, int64_t num_tokens,
                                      double rms_eps, double hc_eps) {
  MHC_SP_NVTX_RANGE("fused_head");
  // Checked first, so that errors name fused_head's own arguments (head_fn, not fn).
  check_projection(head_fn, "head_fn", head_scale, "head_scale", head_base, "head_base",
                   check_stream(residual, "residual"), residual.size(1),
                   "hc_mult rows for the head", 1, residual, "residual");
  const auto [in, g] = check_boundary(partial, residual, post, comb, group, sharded, num_tokens);
  const HeadWeights head{head_fn, head_scale, head_base, check_head_scalars(rms_eps, hc_eps)};
  const c10::DeviceGuard guard(residual.device());
  const HeadArgs args{partial, in, head, sharded, num_tokens};
  return fused_or_composed(g, args, &FusedBoundary::fused_head, composed_fused_head);
}

}  // namespace mhc_sp
