// SPDX-License-Identifier: Apache-2.0
#pragma once
// The PTX the symm kernels need beyond CUDA C++: the global timer their waits measure time with,
// system-scope fences, loads and stores (rule 3's release/acquire pair, relaxed 32-bit and 16-byte
// accesses) and programmatic dependent launch (sm_90+). The emulated device runs the same text
// (cuda/device/asm.cuh). The host's side of the same protocol (the CPU transport) uses the C++
// atomics of mhc_sp/detail/boundary_protocol.h.

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/device/asm.cuh"

namespace mhc_sp::cuda {

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  MHC_SP_ASM("mov.u64 %0, %%globaltimer;", (MHC_SP_ASM_ARG("=l", t)), (), ());
  return t;
}

__device__ __forceinline__ void fence_acq_rel_sys() {
  MHC_SP_ASM("fence.acq_rel.sys;", (), (), ("memory"));
}

// Rule 3's two memory operations (mhc_sp/detail/boundary_protocol.h), at system scope: the writer
// and the reader are different GPUs.
__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  MHC_SP_ASM("st.release.sys.global.u64 [%0], %1;", (),
             (MHC_SP_ASM_ARG("l", p), MHC_SP_ASM_ARG("l", v)), ("memory"));
}

__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  MHC_SP_ASM("ld.acquire.sys.global.u64 %0, [%1];", (MHC_SP_ASM_ARG("=l", v)),
             (MHC_SP_ASM_ARG("l", p)), ("memory"));
  return v;
}

// A word several ranks may store (SegmentHeader::broken, ::blamed), read without ordering.
__device__ __forceinline__ uint32_t load_relaxed_sys(const uint32_t* p) {
  uint32_t v;
  MHC_SP_ASM("ld.relaxed.sys.global.u32 %0, [%1];", (MHC_SP_ASM_ARG("=r", v)),
             (MHC_SP_ASM_ARG("l", p)), ("memory"));
  return v;
}

// 16 bytes as one relaxed system-scope access (atomic per 32-bit word, as PTX promises for v4):
// what several writers store with the same value (every block's copy of a call header), or a
// reader polls while a peer writes (the Lamport mailbox), without a data race.
__device__ __forceinline__ uint4 load_relaxed_v4(const void* p) {
  uint4 v;
  MHC_SP_ASM("ld.relaxed.sys.global.v4.b32 {%0, %1, %2, %3}, [%4];",
             (MHC_SP_ASM_ARG("=r", v.x), MHC_SP_ASM_ARG("=r", v.y), MHC_SP_ASM_ARG("=r", v.z),
              MHC_SP_ASM_ARG("=r", v.w)),
             (MHC_SP_ASM_ARG("l", p)), ("memory"));
  return v;
}

__device__ __forceinline__ void store_relaxed_v4(void* p, const uint4& v) {
  MHC_SP_ASM("st.relaxed.sys.global.v4.b32 [%0], {%1, %2, %3, %4};", (),
             (MHC_SP_ASM_ARG("l", p), MHC_SP_ASM_ARG("r", v.x), MHC_SP_ASM_ARG("r", v.y),
              MHC_SP_ASM_ARG("r", v.z), MHC_SP_ASM_ARG("r", v.w)),
             ("memory"));
}

// One bf16 as a relaxed system-scope access (the Lamport mailbox's scalar path).
__device__ __forceinline__ uint16_t load_relaxed_b16(const void* p) {
  uint16_t v;
  MHC_SP_ASM("ld.relaxed.sys.global.b16 %0, [%1];", (MHC_SP_ASM_ARG("=h", v)),
             (MHC_SP_ASM_ARG("l", p)), ("memory"));
  return v;
}

__device__ __forceinline__ void store_relaxed_b16(void* p, uint16_t v) {
  MHC_SP_ASM("st.relaxed.sys.global.b16 [%0], %1;", (),
             (MHC_SP_ASM_ARG("l", p), MHC_SP_ASM_ARG("h", v)), ("memory"));
}

// Programmatic dependent launch (sm_90+): the dependent kernel waits here until the kernel before
// it has completed and its memory is visible; that kernel lets the dependent's blocks be scheduled
// early (they then sit in the wait) once each of its blocks has executed the trigger.
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  MHC_SP_ASM("griddepcontrol.wait;", (), (), ("memory"));
#endif
}

__device__ __forceinline__ void trigger_dependent_grid() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  MHC_SP_ASM("griddepcontrol.launch_dependents;", (), (), ("memory"));
#endif
}

}  // namespace mhc_sp::cuda
