// SPDX-License-Identifier: Apache-2.0
// CUDA entry point of mhc_pre: project and collapse the input stream. Kernels: cuda/device/pre.cuh.

#include "cuda/math_launch.cuh"

namespace mhc_sp::cuda {

void mhc_pre(const BFloat16* residual, const PreParams& p) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PreArgs a = pre_args(p);
  a.src = bits(residual);
  const bool vec = vector_ok(p.H, residual, p.out);
  dispatch_hc_mult(
      p.n, [&](auto n_const) { launch_pre<decltype(n_const)::value, Mode::Pre>(a, vec, stream); });
}

}  // namespace mhc_sp::cuda
