// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host-side launch helpers shared by the CUDA translation units in csrc/cuda/ (one per op, so a
// parallel build compiles the op instantiations concurrently). Included only from .cu files.

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cuda/device/post.cuh"
#include "mhc_sp/detail/dispatch.h"
#include "cuda/device/pre.cuh"
#include "mhc_sp/detail/kernels.h"

namespace mhc_sp::cuda {

inline const uint16_t* bits(const BFloat16* p) { return reinterpret_cast<const uint16_t*>(p); }
inline uint16_t* bits(BFloat16* p) { return reinterpret_cast<uint16_t*>(p); }

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The 16-byte vector path needs whole vectors per row (H % 8 == 0) and aligned rows.
template <typename... Ptrs>
bool vector_ok(int64_t H, Ptrs... ptrs) {
  return H % 8 == 0 && (aligned16(ptrs) && ...);
}

inline int sm_count() {
  int device = 0, sms = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return std::max(sms, 1);
}

// How a kernel is launched (launch_kernel). cooperative: every block resident at once, or the
// launch fails rather than oversubscribe; dependent: a programmatic dependent of the previous
// kernel in the stream (its blocks may start early and wait in griddepcontrol.wait).
struct LaunchFlags {
  bool cooperative = false;
  bool dependent = false;
};

// Every kernel launch of the project: grid x ranks blocks (gridDim.y = ranks: 1, except for the
// testing module's simulated ranks) of `threads` threads, no dynamic shared memory, on `stream`.
// One function, so that every launch takes the same checked path (and the emulated device,
// csrc/emulation/, runs the same launchers).
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), int64_t grid, int64_t ranks, int threads,
                   cudaStream_t stream, LaunchFlags flags, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid), static_cast<unsigned>(ranks), 1);
  cfg.blockDim = dim3(threads, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (flags.cooperative) {
    attrs[n].id = cudaLaunchAttributeCooperative;
    attrs[n].val.cooperative = 1;
    ++n;
  }
  if (flags.dependent) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// How a pre-style op of T tokens splits its projection: token tiles x H-splits work items (one
// block each in launch_pre); T <= kFusedMaxTokens runs the finish in the last block of a tile.
struct PrePlan {
  int64_t tiles, splits, per_split, items;
  bool fused;
  int64_t ws_floats, counter_ints;
  float rms_count;  // float(streams * H): PreArgs::rms_count
};

template <int N, Mode MODE>
PrePlan plan_pre(int64_t T, int64_t H, int sms) {
  using S = PreShape<N, MODE>;
  PrePlan p{};
  p.tiles = (T + kTileTokens - 1) / kTileTokens;
  const int64_t chunks = (H + S::HC - 1) / S::HC;
  // Split H until there are about two blocks per SM; never more splits than chunks. A block takes
  // a power-of-two group of chunks (a subtree of the projection's summation tree, see LeafTree):
  // how many only decides who adds what, never the order, so it may follow T and the GPU. At most
  // 2^(kBlockLevels - 1) per block, so that the block's pending tree nodes stay in registers.
  const int64_t wanted = std::clamp<int64_t>((2 * int64_t(sms) + p.tiles - 1) / p.tiles, 1, chunks);
  p.per_split = 1;
  while (p.per_split * wanted < chunks && p.per_split < (int64_t{1} << (S::kBlockLevels - 1))) {
    p.per_split *= 2;
  }
  p.splits = (chunks + p.per_split - 1) / p.per_split;
  p.items = p.tiles * p.splits;
  TORCH_CHECK(p.items <= INT_MAX, "mhc_sp: ", T, " tokens need more blocks than a grid holds");
  p.fused = T <= kFusedMaxTokens;
  p.ws_floats = p.items * kTileTokens * S::MP1;
  p.counter_ints = p.fused ? p.tiles : 0;
  p.rms_count = static_cast<float>(int64_t(S::NS) * H);
  return p;
}

// The plan's part of the kernels' arguments (the workspace is the caller's).
inline void use_plan(PreArgs& a, const PrePlan& plan) {
  a.splits = static_cast<int>(plan.splits);
  a.chunks_per_split = static_cast<int>(plan.per_split);
  a.rms_count = plan.rms_count;
}

// Runs the projection (+ post / broadcast copy) and the finish for one pre-style op.
template <int N, Mode MODE>
void launch_pre(PreArgs a, bool vec, cudaStream_t stream) {
  const int sms = sm_count();
  const PrePlan plan = plan_pre<N, MODE>(a.T, a.H, sms);
  const int64_t grid = plan.items;
  const bool fused = plan.fused;
  const int64_t ws_floats = plan.ws_floats;
  const int64_t counter_ints = plan.counter_ints;
  const c10::DataPtr workspace = c10::cuda::CUDACachingAllocator::get()->allocate(
      static_cast<size_t>(ws_floats * sizeof(float) + counter_ints * sizeof(int)));
  a.ws = static_cast<float*>(workspace.get());
  a.counters = fused ? reinterpret_cast<int*>(a.ws + ws_floats) : nullptr;
  use_plan(a, plan);
  if (fused) C10_CUDA_CHECK(cudaMemsetAsync(a.counters, 0, counter_ints * sizeof(int), stream));

  auto run = [&](auto v_const) {
    constexpr int V = decltype(v_const)::value;
    launch_kernel(project_kernel<N, MODE, V>, grid, 1, kProjThreads, stream, {}, a, fused);
    if (!fused) {
      const int64_t groups = (a.T + kFinishTokens - 1) / kFinishTokens;
      const int64_t fgrid = std::min<int64_t>(groups, int64_t(sms) * 64);
      launch_kernel(finish_kernel<N, MODE, V>, fgrid, 1, kFinishThreads, stream, {}, a);
    }
  };
  if (vec) {
    run(std::integral_constant<int, 8>{});
  } else {
    run(std::integral_constant<int, 1>{});
  }
  // `workspace` returns to the caching allocator here; its reuse is ordered on this stream.
}

inline PreArgs pre_args(const PreParams& p) {
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

}  // namespace mhc_sp::cuda
