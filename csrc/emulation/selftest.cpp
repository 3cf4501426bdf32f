// SPDX-License-Identifier: Apache-2.0
// Kernels that check the emulated device itself (tests/emulated/test_emulation_model.py): that a
// missing barrier shows, that divergent barriers and warp collectives are reported rather than
// hung, that a shuffle and the MMA follow the PTX ISA's lane layouts, that blocks waiting for each
// other make progress, and that a grid beyond the resident blocks cannot wait for itself. They
// are launched through the production launch path (cuda/math_launch.cuh).

#include "emulation/selftest.h"

#include <c10/cuda/CUDAStream.h>

#include "mhc_sp/detail/boundary_protocol.h"
#include "cuda/math_launch.cuh"

namespace mhc_sp::emulation {
namespace {

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

__global__ void shfl_kernel(float* out, int lane_mask) {
  const float v = static_cast<float>(threadIdx.x);
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

// Every thread reads its right neighbour's value, after a barrier or not.
__global__ void neighbour_kernel(int* out, bool barrier) {
  __shared__ int values[1024];
  values[threadIdx.x] = static_cast<int>(threadIdx.x) + 1;
  if (barrier) __syncthreads();
  out[threadIdx.x] = values[(threadIdx.x + 1) % blockDim.x];
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

// Half of every warp leaves before the other half's shuffle.
__global__ void partial_warp_kernel(float* out) {
  if (threadIdx.x % 32 >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
}

// D = A (16 x 16) * B (16 x 8), bf16 bits in row-major A and B, fp32 D row-major: each lane
// gathers its fragments as the PTX ISA tables give them (written apart from pre.cuh) and the
// result is scattered the same way.
__global__ void mma_kernel(const uint16_t* A, const uint16_t* B, float* D) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  auto a_at = [&](int row, int col) { return uint32_t(A[row * 16 + col]); };
  auto b_at = [&](int k, int col) { return uint32_t(B[k * 8 + col]); };
  uint32_t a[4];
  for (int i = 0; i < 4; ++i) {  // a_i holds elements 2i, 2i + 1 of the ISA's numbering
    const int row = (i == 0 || i == 2) ? g : g + 8;
    const int col = 2 * t + (i >= 2 ? 8 : 0);
    a[i] = a_at(row, col) | (a_at(row, col + 1) << 16);
  }
  const uint32_t b0 = b_at(2 * t, g) | (b_at(2 * t + 1, g) << 16);
  const uint32_t b1 = b_at(2 * t + 8, g) | (b_at(2 * t + 9, g) << 16);
  float d[4];
  cuda::mma_bf16_m16n8k16(d, a, b0, b1);
  for (int i = 0; i < 4; ++i) D[(i < 2 ? g : g + 8) * 8 + 2 * t + (i & 1)] = d[i];
}

// Block b waits for block b + 1 (forward) or b - 1 to set its flag, then sets its own: a chain
// that ends only if the blocks it waits for are resident or have run.
__global__ void chain_kernel(uint64_t* flags, bool wait_for_later) {
  const int b = blockIdx.x, n = gridDim.x;
  const int awaited = wait_for_later ? b + 1 : b - 1;
  if (threadIdx.x == 0) {
    if (awaited >= 0 && awaited < n) {
      while (boundary::load_acquire(flags + awaited) == 0) {
      }
    }
    boundary::store_release(flags + b, 1);
  }
  __syncthreads();
}

}  // namespace

at::Tensor selftest_shfl(int64_t lane_mask) {
  at::Tensor out = at::empty({32}, at::kFloat);
  cuda::launch_kernel(shfl_kernel, 1, 1, 32, stream(), {}, out.data_ptr<float>(),
                      static_cast<int>(lane_mask));
  return out;
}

at::Tensor selftest_neighbours(int64_t threads, bool barrier) {
  at::Tensor out = at::empty({threads}, at::kInt);
  cuda::launch_kernel(neighbour_kernel, 1, 1, static_cast<int>(threads), stream(), {},
                      out.data_ptr<int>(), barrier);
  return out;
}

void selftest_divergent_barrier() {
  at::Tensor out = at::empty({64}, at::kInt);
  cuda::launch_kernel(divergent_barrier_kernel, 1, 1, 64, stream(), {}, out.data_ptr<int>());
}

void selftest_partial_warp() {
  at::Tensor out = at::empty({64}, at::kFloat);
  cuda::launch_kernel(partial_warp_kernel, 1, 1, 64, stream(), {}, out.data_ptr<float>());
}

at::Tensor selftest_mma(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK_VALUE(a.scalar_type() == at::kBFloat16 && a.sizes() == at::IntArrayRef({16, 16}),
                    "a: expected a (16, 16) bf16 tensor");
  TORCH_CHECK_VALUE(b.scalar_type() == at::kBFloat16 && b.sizes() == at::IntArrayRef({16, 8}),
                    "b: expected a (16, 8) bf16 tensor");
  const at::Tensor A = a.contiguous(), B = b.contiguous();
  at::Tensor d = at::empty({16, 8}, at::kFloat);
  cuda::launch_kernel(mma_kernel, 1, 1, 32, stream(), {},
                      reinterpret_cast<const uint16_t*>(A.const_data_ptr()),
                      reinterpret_cast<const uint16_t*>(B.const_data_ptr()), d.data_ptr<float>());
  return d;
}

void selftest_chain(int64_t blocks, bool wait_for_later, bool cooperative) {
  at::Tensor flags = at::zeros({blocks}, at::kLong);
  cuda::launch_kernel(chain_kernel, blocks, 1, 32, stream(), {.cooperative = cooperative},
                      reinterpret_cast<uint64_t*>(flags.data_ptr()), wait_for_later);
}

}  // namespace mhc_sp::emulation
