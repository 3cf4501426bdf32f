// SPDX-License-Identifier: Apache-2.0
// CUDA entry point of mhc_post_pre: the post (writes residual_out) fused into the next pre.
// Kernels: cuda/device/pre.cuh.

#include "cuda/math_launch.cuh"

namespace mhc_sp::cuda {

void mhc_post_pre(const PostParams& q, const PreParams& p) {
  TORCH_CHECK(!q.x.summed(), "mhc_sp: the CUDA post takes x's rows, not a sum of parts");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PreArgs a = pre_args(p);
  a.src = bits(q.residual);
  a.x = bits(q.x.rows);
  a.post_in = q.post;
  a.comb_in = q.comb;
  a.stream_out = bits(q.residual_out);
  const bool vec = vector_ok(p.H, q.x.rows, q.residual, q.residual_out, p.out);
  dispatch_hc_mult(p.n, [&](auto n_const) {
    launch_pre<decltype(n_const)::value, Mode::PostPre>(a, vec, stream);
  });
}

}  // namespace mhc_sp::cuda
