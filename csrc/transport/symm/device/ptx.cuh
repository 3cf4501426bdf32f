// SPDX-License-Identifier: Apache-2.0
#pragma once
// The PTX the symm kernels need beyond CUDA C++: the global timer their waits measure time with,
// a system-scope fence, and programmatic dependent launch (sm_90+). The emulated device
// (MHC_SP_EMULATION, csrc/emulation/) maps each onto its host equivalent.

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
