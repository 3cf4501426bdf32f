// SPDX-License-Identifier: Apache-2.0
#pragma once
// The ops' bodies on checked arguments (mhc_sp/detail/params.h): no argument checks and no profiler
// ranges. Each public entry (mhc_sp/ops.h) checks its arguments once and calls its body; the
// composed boundaries (csrc/ops/sp_ops.cpp) and the transports call only these, so that every op
// call is one NVTX range and its arguments are checked once. Outputs as docs/design.md §2 gives
// them; the current device guard is the tensors' (the entries set it).

#include <ATen/ATen.h>

#include <tuple>

#include "mhc_sp/detail/params.h"

namespace mhc_sp {

struct PreOutputs {
  Tensor post, comb, layer_input;
};

// mhc_pre: the stream `residual` of shape `s`.
PreOutputs mhc_pre_impl(const Tensor& residual, const StreamShape& s, const PreWeights& w);
// mhc_post: x (T, H) into the stream `in`.
Tensor mhc_post_impl(const Tensor& x, const PostInputs& in);
// mhc_post_pre: residual_out, post, comb, layer_input.
std::tuple<Tensor, Tensor, Tensor, Tensor> mhc_post_pre_impl(const Tensor& x, const PostInputs& in,
                                                             const PreWeights& w);
// mhc_pre_broadcast: x (T, H) copied into s.n streams, then the pre (w.fn per stream).
std::tuple<Tensor, Tensor, Tensor, Tensor> mhc_pre_broadcast_impl(const Tensor& x,
                                                                  const StreamShape& s,
                                                                  const PreWeights& w);
// hc_head: the final collapse of the stream `residual` of shape `s`.
Tensor hc_head_impl(const Tensor& residual, const StreamShape& s, const HeadWeights& w);
// shard_tokens: rank's ceil(rows / world) rows of x, zero-padded.
Tensor shard_tokens_impl(const Tensor& x, int64_t rank, int64_t world_size);

}  // namespace mhc_sp
