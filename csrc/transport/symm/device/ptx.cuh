// SPDX-License-Identifier: Apache-2.0
#pragma once
// The PTX the symm kernels need beyond CUDA C++: the global timer their waits measure time with,
// a system-scope fence, relaxed 16-byte accesses and programmatic dependent launch (sm_90+). The
// emulated device (MHC_SP_EMULATION, csrc/emulation/) maps each onto its host equivalent.

#include <cuda_runtime.h>

#include <cstdint>

namespace mhc_sp::cuda {

__device__ __forceinline__ uint64_t globaltimer_ns() {
#if defined(MHC_SP_EMULATION)
  return ::mhc_sp::emulation::global_timer_ns();  // a poll too: the waits read it between polls
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

__device__ __forceinline__ void fence_acq_rel_sys() {
#if defined(MHC_SP_EMULATION)
  std::atomic_thread_fence(std::memory_order_acq_rel);
#else
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
}

// 16 bytes as one relaxed system-scope access (atomic per 32-bit word, as PTX promises for v4):
// what several writers store with the same value (every block's copy of a call header), or a
// reader polls while a peer writes (the Lamport mailbox), without a data race.
__device__ __forceinline__ uint4 load_relaxed_v4(const void* p) {
  uint4 v;
#if defined(MHC_SP_EMULATION)
  ::mhc_sp::emulation::poll();  // the Lamport waits poll through here
  auto* w = static_cast<uint32_t*>(const_cast<void*>(p));
  v.x = std::atomic_ref<uint32_t>(w[0]).load(std::memory_order_relaxed);
  v.y = std::atomic_ref<uint32_t>(w[1]).load(std::memory_order_relaxed);
  v.z = std::atomic_ref<uint32_t>(w[2]).load(std::memory_order_relaxed);
  v.w = std::atomic_ref<uint32_t>(w[3]).load(std::memory_order_relaxed);
#else
  asm volatile("ld.relaxed.sys.global.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
#endif
  return v;
}

__device__ __forceinline__ void store_relaxed_v4(void* p, const uint4& v) {
#if defined(MHC_SP_EMULATION)
  auto* w = static_cast<uint32_t*>(p);
  std::atomic_ref<uint32_t>(w[0]).store(v.x, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(w[1]).store(v.y, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(w[2]).store(v.z, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(w[3]).store(v.w, std::memory_order_relaxed);
#else
  asm volatile("st.relaxed.sys.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
#endif
}

// Programmatic dependent launch (sm_90+): the dependent kernel waits here until the kernel before
// it has completed and its memory is visible; that kernel lets the dependent's blocks be scheduled
// early (they then sit in the wait) once each of its blocks has executed the trigger.
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void trigger_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace mhc_sp::cuda
