// SPDX-License-Identifier: Apache-2.0
// Kernels that check the emulated device itself (tests/emulated/test_emulation_model.py): that a
// missing barrier shows, that divergent barriers and warp collectives are reported rather than
// hung, that a shuffle and the MMA follow the PTX ISA's lane layouts, that blocks waiting for each
// other make progress, and that a grid beyond the resident blocks cannot wait for itself. They
// are launched through the production launch path (cuda/math_launch.cuh).

#include "emulation/selftest.h"

#include <c10/cuda/CUDAStream.h>

#include "cuda/device/asm.cuh"
#include "cuda/math_launch.cuh"
#include "transport/symm/device/ptx.cuh"

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
      while (cuda::load_acquire_sys(flags + awaited) == 0) {
      }
    }
    cuda::store_release_sys(flags + b, 1);
  }
  __syncthreads();
}

// Warp 0 writes, every warp meets at a shuffle (a warp collective, which orders lanes of one warp
// only), warp 1 reads what warp 0 wrote: a race unless the barrier is there.
__global__ void cross_warp_kernel(int* out, bool barrier) {
  __shared__ int values[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (warp == 0) values[lane] = lane + 1;
  const float one = __shfl_xor_sync(0xffffffffu, 1.f, 1);
  if (barrier) __syncthreads();
  if (warp == 1) out[lane] = values[lane] * static_cast<int>(one);
}

// Lanes of one warp exchange through shared memory with a shuffle between: ordered.
__global__ void same_warp_kernel(int* out) {
  __shared__ int values[32];
  values[threadIdx.x] = static_cast<int>(threadIdx.x) + 1;
  const float one = __shfl_xor_sync(0xffffffffu, 1.f, 1);
  out[threadIdx.x] = values[threadIdx.x ^ 1] * static_cast<int>(one);
}

// What a __shared__ flag that is only ever set holds when a block starts.
__global__ void fresh_flag_kernel(int* out) {
  __shared__ int flag;
  if (threadIdx.x == 0) out[blockIdx.x] = flag;
  __syncthreads();
  if (threadIdx.x == 0) flag = 1;
}

// Block 0 spins on a word of host-mapped memory until block 1, a millisecond later, sets it: with
// a relaxed system-scope load, or with a weak one (a poll the GPU may never see end).
__global__ void poll_kernel(uint32_t* flag, bool weak) {
  if (threadIdx.x != 0) return;
  if (blockIdx.x == 1) {  // the store lands after 20 ms, however busy the host is
    const uint64_t t0 = cuda::globaltimer_ns();
    while (cuda::globaltimer_ns() - t0 < 20000000u) {
      const uint32_t ns = 100000;
      MHC_SP_ASM("nanosleep.u32 %0;", (), (MHC_SP_ASM_ARG("r", ns)), ());
    }
    const uint32_t one = 1;
    MHC_SP_ASM("st.relaxed.sys.global.u32 [%0], %1;", (),
               (MHC_SP_ASM_ARG("l", flag), MHC_SP_ASM_ARG("r", one)), ("memory"));
    return;
  }
  uint32_t v = 0;
  while (v == 0) {
    if (weak) {
      MHC_SP_ASM("ld.global.u32 %0, [%1];", (MHC_SP_ASM_ARG("=r", v)), (MHC_SP_ASM_ARG("l", flag)),
                 ("memory"));
    } else {
      v = cuda::load_relaxed_sys(flag);
    }
  }
}

// A relaxed store at .gpu scope: to host-mapped memory (the host reads it) or device memory.
__global__ void gpu_scope_store_kernel(uint32_t* p) {
  const uint32_t one = 1;
  if (threadIdx.x == 0) {
    MHC_SP_ASM("st.relaxed.gpu.global.u32 [%0], %1;", (),
               (MHC_SP_ASM_ARG("l", p), MHC_SP_ASM_ARG("r", one)), ("memory"));
  }
}

// An instruction the interpreter does not know.
__global__ void unknown_ptx_kernel(uint32_t* out) {
  uint32_t v = 0;
  const uint32_t a = 1, b = 2;
  MHC_SP_ASM("add.u32 %0, %1, %2;", (MHC_SP_ASM_ARG("=r", v)),
             (MHC_SP_ASM_ARG("r", a), MHC_SP_ASM_ARG("r", b)), ());
  out[threadIdx.x] = v;
}

// Programmatic dependent launch: the primary lets its dependent start, then writes its result;
// the dependent copies the result, after griddepcontrol.wait or (wrongly) without it.
__global__ void pdl_primary_kernel(int* data, int n) {
  cuda::trigger_dependent_grid();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    data[i] = i + 1;
  }
}

__global__ void pdl_dependent_kernel(const int* data, int* out, int n, bool wait) {
  if (wait) cuda::wait_for_prerequisite_grid();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = data[i];
  }
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

at::Tensor selftest_cross_warp(bool barrier) {
  at::Tensor out = at::zeros({32}, at::kInt);
  cuda::launch_kernel(cross_warp_kernel, 1, 1, 64, stream(), {}, out.data_ptr<int>(), barrier);
  return out;
}

at::Tensor selftest_same_warp() {
  at::Tensor out = at::zeros({32}, at::kInt);
  cuda::launch_kernel(same_warp_kernel, 1, 1, 32, stream(), {}, out.data_ptr<int>());
  return out;
}

at::Tensor selftest_fresh_flag(int64_t blocks) {
  at::Tensor out = at::zeros({blocks}, at::kInt);
  cuda::launch_kernel(fresh_flag_kernel, blocks, 1, 32, stream(), {}, out.data_ptr<int>());
  return out;
}

namespace {
// A word of host-mapped memory (system memory to the emulated device), freed on return.
struct HostWord {
  uint32_t* p = nullptr;
  HostWord() {
    void* v = nullptr;
    C10_CUDA_CHECK(cudaHostAlloc(&v, sizeof(uint32_t), cudaHostAllocMapped));
    p = static_cast<uint32_t*>(v);
    *p = 0;
  }
  ~HostWord() { cudaFreeHost(p); }
};
}  // namespace

void selftest_poll(bool weak) {
  const HostWord flag;
  cuda::launch_kernel(poll_kernel, 2, 1, 32, stream(), {.cooperative = true}, flag.p, weak);
}

void selftest_gpu_scope_store(bool host_mapped) {
  const HostWord word;
  at::Tensor device_word = at::zeros({1}, at::kInt);
  uint32_t* p = host_mapped ? word.p : reinterpret_cast<uint32_t*>(device_word.data_ptr());
  cuda::launch_kernel(gpu_scope_store_kernel, 1, 1, 32, stream(), {}, p);
}

void selftest_unknown_ptx() {
  at::Tensor out = at::zeros({32}, at::kInt);
  cuda::launch_kernel(unknown_ptx_kernel, 1, 1, 32, stream(), {},
                      reinterpret_cast<uint32_t*>(out.data_ptr()));
}

at::Tensor selftest_pdl(int64_t n, bool wait) {
  at::Tensor data = at::zeros({n}, at::kInt), out = at::zeros({n}, at::kInt);
  const int n32 = static_cast<int>(n);
  cuda::launch_kernel(pdl_primary_kernel, 2, 1, 64, stream(), {}, data.data_ptr<int>(), n32);
  cuda::launch_kernel(pdl_dependent_kernel, 2, 1, 64, stream(), {.dependent = true},
                      static_cast<const int*>(data.data_ptr<int>()), out.data_ptr<int>(), n32,
                      wait);
  return out;
}

}  // namespace mhc_sp::emulation
