// Sequence-parallel collectives and the fused boundary ops (DESIGN §2). Device-generic: the math
// runs through the ops of mhc_ops.cpp, the collectives through the group's communicator (gloo for
// CPU tensors, mhc_sp's NCCL communicator on the current stream for CUDA tensors). Nothing here
// synchronises with the host on CUDA.

#include <c10/core/DeviceGuard.h>

#include "mhc_sp/checks.h"
#include "mhc_sp/comm.h"
#include "mhc_sp/nvtx.h"
#include "mhc_sp/ops.h"

namespace mhc_sp {
namespace {

int64_t shard_rows(int64_t tokens, int64_t world) { return (tokens + world - 1) / world; }

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
  MHC_SP_NVTX_RANGE("reduce_scatter");
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
  MHC_SP_NVTX_RANGE("all_reduce");
  Tensor in = x.narrow(0, 0, rows);
  if (g.world == 1) return in;
  Tensor out = at::empty_like(in);
  g.comm->all_reduce(out, in);
  return out;
}

// Every rank's x (rows, ...) concatenated, first num_tokens rows kept (-1: all).
Tensor all_gather_rows(const Tensor& x, int64_t num_tokens, const GroupHandle& g) {
  MHC_SP_NVTX_RANGE("all_gather");
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
  TORCH_CHECK_VALUE(num_tokens >= 0 && num_tokens <= available, "num_tokens: expected a value in [0, ",
                    available, "] (rows of ", rows_of, "), got ", num_tokens);
}

// Rows the stream must have on this rank: its shard when sharded, all tokens otherwise.
int64_t stream_rows(bool sharded, int64_t num_tokens, const GroupHandle& g) {
  return sharded ? shard_rows(num_tokens, g.world) : num_tokens;
}

void check_stream_rows(const Tensor& residual, int64_t expected, bool sharded, int64_t num_tokens,
                       const GroupHandle& g) {
  TORCH_CHECK_VALUE(residual.size(0) == expected, "residual: expected ", expected, " rows (",
                    sharded ? "this rank's shard: ceil(num_tokens / world) = ceil(" : "num_tokens = ",
                    num_tokens, sharded ? c10::str(" / ", g.world, ")") : std::string(), "), got shape ",
                    shape_str(residual));
}

// The reduced sublayer output this rank posts into its stream rows.
Tensor reduce_partial(const Tensor& partial, const Tensor& residual, const std::string& group,
                      bool sharded, int64_t num_tokens, GroupHandle& g_out) {
  const StreamShape s = check_stream(residual, "residual");
  check_tensor(partial, "partial", at::kBFloat16, 2, "(tokens, hidden)", residual, "residual");
  check_size(partial, "partial", 1, s.H, "hidden");
  check_num_tokens(num_tokens, partial.size(0), "partial");
  g_out = group_for(group, partial, "partial");
  check_stream_rows(residual, stream_rows(sharded, num_tokens, g_out), sharded, num_tokens, g_out);
  // Rows past num_tokens are ignored (treated as zero) so the stream's padding rows stay zero.
  return sharded ? reduce_scatter_rows(partial, num_tokens, g_out)
                 : all_reduce_rows(partial, num_tokens, g_out);
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

}  // namespace

Tensor shard_tokens(const Tensor& x, int64_t rank, int64_t world_size) {
  MHC_SP_NVTX_RANGE("shard_tokens");
  check_rows_tensor(x, "x");
  TORCH_CHECK_VALUE(world_size >= 1, "world_size: expected a value >= 1, got ", world_size);
  TORCH_CHECK_VALUE(rank >= 0 && rank < world_size, "rank: expected a value in [0, ", world_size,
                    "), got ", rank);
  const int64_t rows = shard_rows(x.size(0), world_size);
  const int64_t begin = std::min(rank * rows, x.size(0));
  const int64_t real = std::min(rows, x.size(0) - begin);
  auto sizes = x.sizes().vec();
  sizes[0] = rows;
  const c10::DeviceGuard guard(x.device());
  Tensor out = at::empty(sizes, x.options());
  out.narrow(0, 0, real).copy_(x.narrow(0, begin, real));
  out.narrow(0, real, rows - real).zero_();
  return out;
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
  const c10::DeviceGuard guard(x.device());
  const int64_t tokens = x.size(0);
  const Tensor rows = sharded && g.world > 1 ? shard_tokens(x, g.rank, g.world) : x;
  auto [residual, post, comb, layer_input] =
      mhc_pre_broadcast(rows, fn, hc_scale, hc_base, norm_weight, rms_eps, hc_pre_eps,
                        hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps);
  if (sharded && g.world > 1) layer_input = all_gather_rows(layer_input, tokens, g).contiguous();
  return {residual, post, comb, layer_input};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> fused_layer(
    const Tensor& partial, const Tensor& residual, const Tensor& post, const Tensor& comb,
    const Tensor& fn, const Tensor& hc_scale, const Tensor& hc_base, const OptTensor& norm_weight,
    const std::string& group, bool sharded, int64_t num_tokens, double rms_eps, double hc_pre_eps,
    double hc_sinkhorn_eps, double hc_post_mult, int64_t sinkhorn_iters, double norm_eps) {
  MHC_SP_NVTX_RANGE("fused_layer");
  GroupHandle g{};
  const c10::DeviceGuard guard(residual.device());
  const Tensor x = reduce_partial(partial, residual, group, sharded, num_tokens, g);
  auto [residual_out, post_out, comb_out, layer_input] = [&] {
    MHC_SP_NVTX_RANGE("mhc_post_pre");
    return mhc_post_pre(x, residual, post, comb, fn, hc_scale, hc_base, norm_weight, rms_eps,
                        hc_pre_eps, hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps);
  }();
  if (sharded && g.world > 1) layer_input = all_gather_rows(layer_input, num_tokens, g).contiguous();
  return {residual_out, post_out, comb_out, layer_input};
}

std::tuple<Tensor, Tensor> fused_head(const Tensor& partial, const Tensor& residual,
                                      const Tensor& post, const Tensor& comb, const Tensor& head_fn,
                                      const Tensor& head_scale, const Tensor& head_base,
                                      const std::string& group, bool sharded, int64_t num_tokens,
                                      double rms_eps, double hc_eps) {
  MHC_SP_NVTX_RANGE("fused_head");
  GroupHandle g{};
  const c10::DeviceGuard guard(residual.device());
  // Checked here so that errors name fused_head's own arguments (hc_head would say "fn").
  check_projection(head_fn, "head_fn", head_scale, "head_scale", head_base, "head_base",
                   check_stream(residual, "residual"), residual.size(1), "hc_mult rows for the head", 1,
                   residual, "residual");
  const Tensor x = reduce_partial(partial, residual, group, sharded, num_tokens, g);
  Tensor residual_out = mhc_post(x, residual, post, comb);
  Tensor hidden = hc_head(residual_out, head_fn, head_scale, head_base, rms_eps, hc_eps);
  if (sharded && g.world > 1) hidden = all_gather_rows(hidden, num_tokens, g).contiguous();
  return {hidden, residual_out};
}

}  // namespace mhc_sp
