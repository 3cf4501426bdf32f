// CUDA entry points of the mHC math ops (mhc_sp::cuda_kernels(), see mhc_sp/kernels.h): thin
// launchers over the kernels in mhc_sp/cuda/*.cuh. csrc/mhc_ops.cpp has already validated the
// arguments, allocated the outputs and set the device guard. Everything runs on the current
// stream; the only allocation is the pre's split-K workspace, from the caching allocator, so the
// ops never sync with the host and are CUDA-graph capturable.

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "mhc_sp/cuda/post.cuh"
#include "mhc_sp/cuda/pre.cuh"
#include "mhc_sp/kernels.h"

namespace mhc_sp {
namespace cuda {
namespace {

const uint16_t* bits(const BFloat16* p) { return reinterpret_cast<const uint16_t*>(p); }
uint16_t* bits(BFloat16* p) { return reinterpret_cast<uint16_t*>(p); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The 16-byte vector path needs whole vectors per row (H % 8 == 0) and aligned rows.
template <typename... Ptrs>
bool vector_ok(int64_t H, Ptrs... ptrs) {
  return H % 8 == 0 && (aligned16(ptrs) && ...);
}

int sm_count() {
  int device = 0, sms = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return std::max(sms, 1);
}

template <typename F>
void dispatch_hc_mult(int64_t n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
  }
  TORCH_CHECK(false, "hc_mult ", n, " is outside [1, ", kMaxHcMult, "]");
}

template <int N, int V>
void launch_post(const PostParams& p, cudaStream_t stream) {
  PostArgs a{p.T, p.H, bits(p.x), bits(p.residual), p.post, p.comb, bits(p.residual_out), 0};
  a.spans = (p.H + kPostThreads * V - 1) / (kPostThreads * V);
  const int64_t items = p.T * a.spans;
  const int64_t grid = std::min<int64_t>(items, int64_t(sm_count()) * 32);  // blocks stride
  post_kernel<N, V><<<static_cast<unsigned>(grid), kPostThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void mhc_post(const PostParams& p) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool vec = vector_ok(p.H, p.x, p.residual, p.residual_out);
  dispatch_hc_mult(p.n, [&](auto n_const) {
    constexpr int N = decltype(n_const)::value;
    if (vec) {
      launch_post<N, 8>(p, stream);
    } else {
      launch_post<N, 1>(p, stream);
    }
  });
}

// Runs the projection (+ post / broadcast copy) and the finish for one pre-style op.
template <int N, Mode MODE>
void launch_pre(PreArgs a, bool vec, cudaStream_t stream) {
  using S = PreShape<N, MODE>;
  const int sms = sm_count();
  const int64_t tiles = (a.T + kTileTokens - 1) / kTileTokens;
  const int64_t chunks = (a.H + S::HC - 1) / S::HC;
  // Split H until there are about two blocks per SM; never more splits than chunks.
  int64_t splits = std::clamp<int64_t>((2 * int64_t(sms) + tiles - 1) / tiles, 1, chunks);
  const int64_t per_split = (chunks + splits - 1) / splits;
  splits = (chunks + per_split - 1) / per_split;  // no empty split
  const int64_t grid = tiles * splits;
  TORCH_CHECK(grid <= INT_MAX, "mhc_sp: ", a.T, " tokens need more blocks than a grid holds");
  const bool fused = a.T <= kFusedMaxTokens;

  const int64_t ws_floats = grid * kTileTokens * S::MP1;
  const int64_t counter_ints = fused ? tiles : 0;
  const c10::DataPtr workspace = c10::cuda::CUDACachingAllocator::get()->allocate(
      static_cast<size_t>(ws_floats * sizeof(float) + counter_ints * sizeof(int)));
  a.ws = static_cast<float*>(workspace.get());
  a.counters = fused ? reinterpret_cast<int*>(a.ws + ws_floats) : nullptr;
  a.splits = static_cast<int>(splits);
  a.chunks_per_split = static_cast<int>(per_split);
  if (fused) C10_CUDA_CHECK(cudaMemsetAsync(a.counters, 0, counter_ints * sizeof(int), stream));

  auto run = [&](auto v_const) {
    constexpr int V = decltype(v_const)::value;
    project_kernel<N, MODE, V><<<static_cast<unsigned>(grid), kProjThreads, 0, stream>>>(a, fused);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (!fused) {
      const int64_t groups = (a.T + kFinishTokens - 1) / kFinishTokens;
      const int64_t fgrid = std::min<int64_t>(groups, int64_t(sms) * 64);
      finish_kernel<N, MODE, V><<<static_cast<unsigned>(fgrid), kFinishThreads, 0, stream>>>(a);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  };
  if (vec) {
    run(std::integral_constant<int, 8>{});
  } else {
    run(std::integral_constant<int, 1>{});
  }
  // `workspace` returns to the caching allocator here; its reuse is ordered on this stream.
}

PreArgs pre_args(const PreParams& p) {
  PreArgs a{};
  a.T = p.T;
  a.H = p.H;
  a.fn = p.fn;
  a.scale = p.scale;
  a.base = p.base;
  a.norm_weight = p.norm_weight;
  a.s = p.s;
  a.post = p.post;
  a.comb = p.comb;
  a.out = bits(p.out);
  return a;
}

void mhc_pre(const BFloat16* residual, const PreParams& p) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PreArgs a = pre_args(p);
  a.src = bits(residual);
  const bool vec = vector_ok(p.H, residual, p.out);
  dispatch_hc_mult(p.n, [&](auto n_const) {
    launch_pre<decltype(n_const)::value, Mode::Pre>(a, vec, stream);
  });
}

void mhc_post_pre(const PostParams& q, const PreParams& p) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PreArgs a = pre_args(p);
  a.src = bits(q.residual);
  a.x = bits(q.x);
  a.post_in = q.post;
  a.comb_in = q.comb;
  a.stream_out = bits(q.residual_out);
  const bool vec = vector_ok(p.H, q.x, q.residual, q.residual_out, p.out);
  dispatch_hc_mult(p.n, [&](auto n_const) {
    launch_pre<decltype(n_const)::value, Mode::PostPre>(a, vec, stream);
  });
}

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

void hc_head(const BFloat16* residual, const PreParams& p) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PreArgs a = pre_args(p);
  a.src = bits(residual);
  a.norm_weight = nullptr;  // the head has no norm (PreParams passes none either)
  const bool vec = vector_ok(p.H, residual, p.out);
  dispatch_hc_mult(p.n, [&](auto n_const) {
    launch_pre<decltype(n_const)::value, Mode::Head>(a, vec, stream);
  });
}

}  // namespace
}  // namespace cuda

const KernelTable& cuda_kernels() {
  static const KernelTable table{"cuda-sm90",       cuda::mhc_post,          cuda::mhc_pre,
                                 cuda::mhc_post_pre, cuda::mhc_pre_broadcast, cuda::hc_head};
  return table;
}

}  // namespace mhc_sp
