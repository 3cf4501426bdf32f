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

// ---- atomics and fences (device.h: the orders and why) ------------------------------------------

namespace mhc_sp::emulation {
#if defined(__SANITIZE_THREAD__)
inline constexpr std::memory_order kDeviceAtomicOrder = std::memory_order_acq_rel;
#else
inline constexpr std::memory_order kDeviceAtomicOrder = std::memory_order_relaxed;
#endif
}  // namespace mhc_sp::emulation

template <typename T>
inline T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v, ::mhc_sp::emulation::kDeviceAtomicOrder);
}

template <typename T>
inline T atomicCAS(T* p, T expected, T desired) {
  std::atomic_ref<T>(*p).compare_exchange_strong(
      expected, desired, ::mhc_sp::emulation::kDeviceAtomicOrder, std::memory_order_relaxed);
  return expected;  // the old value, whether or not it was replaced
}

template <typename T>
inline T atomicCAS_system(T* p, T expected, T desired) {
  return atomicCAS(p, expected, desired);
}

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

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
enum cudaStreamCaptureStatus : int { cudaStreamCaptureStatusNone = 0 };
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

// Runs the kernel on the stream's device and returns once it has finished (the emulated streams
// are synchronous). Programmatic dependent launch changes nothing: the previous kernel has ended.
template <typename... Params, typename... Args>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(Params...),
                               Args&&... args) {
  bool cooperative = false;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    if (config->attrs[i].id == cudaLaunchAttributeCooperative) {
      cooperative = config->attrs[i].val.cooperative != 0;
    }
  }
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  const std::string failed = ::mhc_sp::emulation::launch(
      ::mhc_sp::emulation::stream_device(config->stream), config->gridDim, config->blockDim,
      cooperative, [kernel, &params] { std::apply(kernel, params); });
  return failed.empty() ? cudaSuccess : ::mhc_sp::emulation::record_launch_error(failed);
}
