// SPDX-License-Identifier: Apache-2.0
#pragma once
// The emulated device's CUDA (test-only): what the device sources and their launchers use from
// CUDA, for the host compiler (csrc/emulation/device.h). Found before the toolkit's header only by
// the emulation module's build.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emulation/device.h"

// ---- qualifiers and built-in variables ---------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
// One copy per block: a block's threads are fibers of one OS thread.
#define __shared__ static thread_local

// threadIdx, blockIdx, blockDim, gridDim: emulation/device.h

// ---- synchronisation and warp collectives -------------------------------------------------------

#define __syncthreads() ::mhc_sp::emulation::syncthreads(__FILE__, __LINE__)
#define __syncthreads_or(p) ::mhc_sp::emulation::syncthreads_or((p) ? 1 : 0, __FILE__, __LINE__)
#define __syncwarp(mask) ::mhc_sp::emulation::syncwarp((mask), __FILE__, __LINE__)
#define __shfl_xor_sync(mask, v, lane_mask) \
  ::mhc_sp::emulation::shfl_xor((mask), (v), (lane_mask), __FILE__, __LINE__)
#define __trap() ::mhc_sp::emulation::trap(__FILE__, __LINE__)

// ---- loads, conversions, math -------------------------------------------------------------------

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

template <typename T>
inline T __ldcg(const T* p) {
  return *p;
}

inline float __uint_as_float(unsigned v) {
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}

inline float __int_as_float(int v) {
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}

inline unsigned __float_as_uint(float f) {
  unsigned v;
  std::memcpy(&v, &f, 4);
  return v;
}

// CUDA's min and max overloads for the integer types the kernels mix.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

// ---- inline PTX, atomics and fences: the emulated device's memory model (device.h) -------------

// The device sources write inline PTX as MHC_SP_ASM(text, (outputs), (inputs), (clobbers)) with
// MHC_SP_ASM_ARG(constraint, value) operands (cuda/device/asm.cuh). Here the statement runs through
// the PTX interpreter: the same text, the same operands in the same order.
#define MHC_SP_ASM(text, outputs, inputs, clobbers)                                 \
  ::mhc_sp::emulation::run_ptx(text, __FILE__, __LINE__, {MHC_SP_ASM_LIST outputs}, \
                               {MHC_SP_ASM_LIST inputs})
#define MHC_SP_ASM_LIST(...) __VA_ARGS__
#define MHC_SP_ASM_ARG(constraint, value) ::mhc_sp::emulation::asm_operand(constraint, value)

namespace mhc_sp::emulation {

template <typename T>
uint64_t value_bits(T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics of 32 or 64 bits");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}

// CUDA's atomic intrinsics: relaxed read-modify-writes at their scope (atomicX: .gpu,
// atomicX_system: .sys), through the memory model like the PTX atom they compile to.
template <typename T, typename U, typename C>
T atomic_intrinsic(Rmw op, T* p, U operand, C compare, Scope scope, const char* name,
                   const char* file, int line) {
  if constexpr (std::is_floating_point_v<T>) {
    static_assert(sizeof(T) == 4, "atomicAdd takes float here");
    op = Rmw::kAddF32;
  }
  const uint64_t old =
      mem_rmw(op, p, sizeof(T), value_bits(static_cast<T>(operand)),
              value_bits(static_cast<T>(compare)), Sem::kRelaxed, scope, Site{file, line, name});
  T out;
  std::memcpy(&out, &old, sizeof(T));
  return out;
}

}  // namespace mhc_sp::emulation

#define atomicAdd(p, v)                                                                          \
  ::mhc_sp::emulation::atomic_intrinsic(::mhc_sp::emulation::Rmw::kAdd, (p), (v), 0,             \
                                        ::mhc_sp::emulation::Scope::kGpu, "atomicAdd", __FILE__, \
                                        __LINE__)
#define atomicExch(p, v)                                                                          \
  ::mhc_sp::emulation::atomic_intrinsic(::mhc_sp::emulation::Rmw::kExch, (p), (v), 0,             \
                                        ::mhc_sp::emulation::Scope::kGpu, "atomicExch", __FILE__, \
                                        __LINE__)
#define atomicCAS(p, expected, desired)                                                            \
  ::mhc_sp::emulation::atomic_intrinsic(::mhc_sp::emulation::Rmw::kCas, (p), (desired),            \
                                        (expected), ::mhc_sp::emulation::Scope::kGpu, "atomicCAS", \
                                        __FILE__, __LINE__)
#define atomicCAS_system(p, expected, desired)                                          \
  ::mhc_sp::emulation::atomic_intrinsic(::mhc_sp::emulation::Rmw::kCas, (p), (desired), \
                                        (expected), ::mhc_sp::emulation::Scope::kSys,   \
                                        "atomicCAS_system", __FILE__, __LINE__)
// __threadfence(): fence.sc.gpu; __threadfence_system(): fence.sc.sys.
#define __threadfence()                                                                           \
  ::mhc_sp::emulation::mem_fence(::mhc_sp::emulation::Sem::kSc, ::mhc_sp::emulation::Scope::kGpu, \
                                 ::mhc_sp::emulation::Site{__FILE__, __LINE__, "__threadfence()"})
#define __threadfence_system()                                         \
  ::mhc_sp::emulation::mem_fence(                                      \
      ::mhc_sp::emulation::Sem::kSc, ::mhc_sp::emulation::Scope::kSys, \
      ::mhc_sp::emulation::Site{__FILE__, __LINE__, "__threadfence_system()"})

// ---- the runtime API subset the launchers and the symm workspace use ----------------------------

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorLaunchFailure = 719,
  cudaErrorCooperativeLaunchTooLarge = 720,
};

struct CUstream_st;  // an emulated stream: its device (runtime.cpp)
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;

enum cudaDeviceAttr : int { cudaDevAttrMultiProcessorCount = 16 };
enum cudaStreamCaptureStatus : int {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1
};
enum cudaLaunchAttributeID : int {
  cudaLaunchAttributeCooperative = 2,
  cudaLaunchAttributeProgrammaticStreamSerialization = 4,
};

struct cudaLaunchAttributeValue {
  int cooperative;
  int programmaticStreamSerializationAllowed;
};

struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};

struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned numAttrs;
};

constexpr unsigned cudaHostAllocMapped = 2;
constexpr unsigned cudaEventDisableTiming = 2;
constexpr unsigned cudaEventRecordDefault = 0;
constexpr unsigned cudaEventRecordExternal = 1;
constexpr unsigned cudaEventWaitDefault = 0;
constexpr unsigned cudaEventWaitExternal = 1;

namespace mhc_sp::emulation {
int stream_device(cudaStream_t stream);
cudaError_t record_launch_error(const std::string& what);
}  // namespace mhc_sp::emulation

cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned flags);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream);
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t stream, unsigned flags);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned flags);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);

// What the occupancy calculator reports for any kernel: the current device's blocks per SM.
template <typename Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel, int threads,
                                                          size_t dynamic_smem) {
  if (blocks == nullptr || threads <= 0 || dynamic_smem != 0) return cudaErrorInvalidValue;
  int device = 0;
  cudaGetDevice(&device);
  *blocks = ::mhc_sp::emulation::device_blocks_per_sm(device);
  return cudaSuccess;
}

// Launches the kernel on the stream's device (emulation/device.h: launch). The kernel's parameters
// are copied into the launch, as CUDA copies them into the launch's parameter space.
template <typename... Params, typename... Args>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(Params...),
                               Args&&... args) {
  bool cooperative = false, dependent = false;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    if (config->attrs[i].id == cudaLaunchAttributeCooperative) {
      cooperative = config->attrs[i].val.cooperative != 0;
    }
    if (config->attrs[i].id == cudaLaunchAttributeProgrammaticStreamSerialization) {
      dependent = config->attrs[i].val.programmaticStreamSerializationAllowed != 0;
    }
  }
  auto body = [kernel, params = std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)] {
    std::apply(kernel, params);
  };
  const std::string failed =
      ::mhc_sp::emulation::launch(::mhc_sp::emulation::stream_device(config->stream),
                                  config->gridDim, config->blockDim, cooperative, dependent, body);
  return failed.empty() ? cudaSuccess : ::mhc_sp::emulation::record_launch_error(failed);
}
