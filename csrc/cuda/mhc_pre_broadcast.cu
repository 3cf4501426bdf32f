// SPDX-License-Identifier: Apache-2.0
// CUDA entry point of mhc_pre_broadcast: first layer, x copied into the n streams. Kernels:
// cuda/device/pre.cuh.

#include "cuda/math_launch.cuh"

namespace mhc_sp::cuda {

void mhc_pre_broadcast(const BFloat16* x, BFloat16* residual_out, const PreParams& p) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PreArgs a = pre_args(p);
  a.src = bits(x);
  a.stream_out = bits(residual_out);
  const bool vec = vector_ok(p.H, x, residual_out, p.out);
  dispatch_hc_mult(p.n, [&](auto n_const) {
    launch_pre<decltype(n_const)::value, Mode::Broadcast>(a, vec, stream);
  });
}

}  // namespace mhc_sp::cuda
