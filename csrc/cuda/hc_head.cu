// SPDX-License-Identifier: Apache-2.0
// CUDA entry point of hc_head: final collapse with the head weights. Kernels: cuda/device/pre.cuh.

#include "cuda/math_launch.cuh"

namespace mhc_sp::cuda {

void hc_head(const BFloat16* residual, const PreParams& p) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PreArgs a = pre_args(p);
  a.src = bits(residual);
  a.norm_weight = nullptr;  // the head has no norm (PreParams passes none either)
  const bool vec = vector_ok(p.H, residual, p.out);
  dispatch_hc_mult(
      p.n, [&](auto n_const) { launch_pre<decltype(n_const)::value, Mode::Head>(a, vec, stream); });
}

}  // namespace mhc_sp::cuda
