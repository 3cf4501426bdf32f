// SPDX-License-Identifier: Apache-2.0
// CUDA entry points of the mHC math ops (mhc_sp::cuda_kernels(), see mhc_sp/detail/kernels.h): thin
// launchers over the kernels in cuda/device/*.cuh; mhc_post is here, the pre family in one
// translation unit per op (csrc/cuda/*.cu). csrc/ops/mhc_ops.cpp has already validated the
// arguments, allocated the outputs and set the device guard. Everything runs on the current stream;
// the only allocation is the pre's split-K workspace, from the caching allocator, so the ops never
// sync with the host and are CUDA-graph capturable.

#include "cuda/math_launch.cuh"

namespace mhc_sp {
namespace cuda {
namespace {

template <int N, int V>
void launch_post(const PostParams& p, cudaStream_t stream) {
  PostArgs a{p.T, p.H, bits(p.x.rows), bits(p.residual), p.post, p.comb, bits(p.residual_out), 0};
  a.spans = (p.H + kPostThreads * V - 1) / (kPostThreads * V);
  const int64_t items = p.T * a.spans;
  const int64_t grid = std::min<int64_t>(items, int64_t(sm_count()) * 32);  // blocks stride
  launch_kernel(post_kernel<N, V>, grid, 1, kPostThreads, stream, {}, a);
}

}  // namespace

void mhc_post(const PostParams& p) {
  TORCH_CHECK(!p.x.summed(), "mhc_sp: the CUDA post takes x's rows, not a sum of parts");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool vec = vector_ok(p.H, p.x.rows, p.residual, p.residual_out);
  dispatch_hc_mult(p.n, [&](auto n_const) {
    constexpr int N = decltype(n_const)::value;
    if (vec) {
      launch_post<N, 8>(p, stream);
    } else {
      launch_post<N, 1>(p, stream);
    }
  });
}

}  // namespace cuda

// Named after the architectures the build compiled (e.g. "cuda-9.0a,10.0a"): the kernels need
// sm_80+ (bf16 mma.sync) and are tuned on Hopper.
const KernelTable& cuda_kernels() {
  static const KernelTable table{
      .name = "cuda-" MHC_SP_CUDA_ARCH_LIST,
      .mhc_post = cuda::mhc_post,
      .mhc_pre = cuda::mhc_pre,
      .mhc_post_pre = cuda::mhc_post_pre,
      .mhc_pre_broadcast = cuda::mhc_pre_broadcast,
      .hc_head = cuda::hc_head,
  };
  return table;
}

}  // namespace mhc_sp
