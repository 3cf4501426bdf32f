// SPDX-License-Identifier: Apache-2.0
// Every memory access of the emulated device sources, seen by the emulated device.
//
// The translation units that compile the device sources (csrc/emulation/sources/) are built with
// the compiler's ThreadSanitizer instrumentation (-fsanitize=thread) but are not linked with its
// runtime: the calls the compiler puts before every load and store (__tsan_read4(addr), ...)
// land here, in the emulation's own small runtime of that interface. It hands each access to
// on_access, which poisons and race-checks __shared__ memory (shared_memory.cpp), reports polls
// through weak loads of memory other devices write, and delays stores to it now and then
// (memory.cpp). The atomic built-ins the instrumentation redirects are performed as written.
//
// Not in the sanitizer builds of the module (scripts/sanitize.sh): there the device sources carry
// that sanitizer's instrumentation instead, and the racecheck, the poison and the weak-poll
// reports are off (the tests that need them skip, saying so).

#include <cstdint>

#include "emulation/internal.h"

namespace mhc_sp::emulation::detail {
namespace {

inline void on_access(const void* addr, int bytes, bool write, const void* pc) {
  Block* b = current_block();
  if (b == nullptr || b->running == nullptr) return;
  if (shared_access(*b, addr, bytes, write, pc)) return;
  if (system_memory_name(addr, bytes) == nullptr) return;
  if (write) {
    system_store_delay();
  } else {
    weak_system_load(*b->running, pc, addr, nullptr);
  }
}

// GCC passes its __ATOMIC_* order (possibly with HLE bits in the high half).
inline int order(int mo) {
  mo &= 0xffff;
  return mo > __ATOMIC_SEQ_CST ? __ATOMIC_SEQ_CST : mo;
}

inline int failure_order(int mo) {
  mo = order(mo);
  return mo == __ATOMIC_RELEASE ? __ATOMIC_RELAXED : mo == __ATOMIC_ACQ_REL ? __ATOMIC_ACQUIRE : mo;
}

}  // namespace
}  // namespace mhc_sp::emulation::detail

using mhc_sp::emulation::detail::failure_order;
using mhc_sp::emulation::detail::on_access;
using mhc_sp::emulation::detail::order;

#define MHC_SP_HOOK extern "C" __attribute__((visibility("hidden")))
#define MHC_SP_PC __builtin_return_address(0)

MHC_SP_HOOK void __tsan_init() {}
MHC_SP_HOOK void __tsan_func_entry(void*) {}
MHC_SP_HOOK void __tsan_func_exit() {}
MHC_SP_HOOK void __tsan_vptr_update(void**, void*) {}
MHC_SP_HOOK void __tsan_vptr_read(void**) {}
MHC_SP_HOOK void __tsan_read_range(void* a, unsigned long n) {
  on_access(a, static_cast<int>(n), false, MHC_SP_PC);
}
MHC_SP_HOOK void __tsan_write_range(void* a, unsigned long n) {
  on_access(a, static_cast<int>(n), true, MHC_SP_PC);
}

#define MHC_SP_ACCESS_HOOKS(N)                                                              \
  MHC_SP_HOOK void __tsan_read##N(void* a) { on_access(a, N, false, MHC_SP_PC); }           \
  MHC_SP_HOOK void __tsan_write##N(void* a) { on_access(a, N, true, MHC_SP_PC); }           \
  MHC_SP_HOOK void __tsan_unaligned_read##N(void* a) { on_access(a, N, false, MHC_SP_PC); } \
  MHC_SP_HOOK void __tsan_unaligned_write##N(void* a) { on_access(a, N, true, MHC_SP_PC); } \
  MHC_SP_HOOK void __tsan_volatile_read##N(void* a) { on_access(a, N, false, MHC_SP_PC); }  \
  MHC_SP_HOOK void __tsan_volatile_write##N(void* a) { on_access(a, N, true, MHC_SP_PC); }

MHC_SP_ACCESS_HOOKS(1)
MHC_SP_ACCESS_HOOKS(2)
MHC_SP_ACCESS_HOOKS(4)
MHC_SP_ACCESS_HOOKS(8)
MHC_SP_ACCESS_HOOKS(16)

// The atomics of the instrumented code (std::atomic and __atomic built-ins in the shim's and
// torch's inline code), as written.
#define MHC_SP_ATOMIC_RMW(N, T, name, builtin)                          \
  MHC_SP_HOOK T __tsan_atomic##N##_##name(volatile T* a, T v, int mo) { \
    return builtin(a, v, order(mo));                                    \
  }
#define MHC_SP_ATOMIC_HOOKS(N, T)                                                              \
  MHC_SP_HOOK T __tsan_atomic##N##_load(const volatile T* a, int mo) {                         \
    return __atomic_load_n(a, order(mo));                                                      \
  }                                                                                            \
  MHC_SP_HOOK void __tsan_atomic##N##_store(volatile T* a, T v, int mo) {                      \
    __atomic_store_n(a, v, order(mo));                                                         \
  }                                                                                            \
  MHC_SP_ATOMIC_RMW(N, T, exchange, __atomic_exchange_n)                                       \
  MHC_SP_ATOMIC_RMW(N, T, fetch_add, __atomic_fetch_add)                                       \
  MHC_SP_ATOMIC_RMW(N, T, fetch_sub, __atomic_fetch_sub)                                       \
  MHC_SP_ATOMIC_RMW(N, T, fetch_and, __atomic_fetch_and)                                       \
  MHC_SP_ATOMIC_RMW(N, T, fetch_or, __atomic_fetch_or)                                         \
  MHC_SP_ATOMIC_RMW(N, T, fetch_xor, __atomic_fetch_xor)                                       \
  MHC_SP_ATOMIC_RMW(N, T, fetch_nand, __atomic_fetch_nand)                                     \
  MHC_SP_HOOK int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int mo, \
                                                             int fmo) {                        \
    return __atomic_compare_exchange_n(a, c, v, false, order(mo), failure_order(fmo));         \
  }                                                                                            \
  MHC_SP_HOOK int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int mo,   \
                                                           int fmo) {                          \
    return __atomic_compare_exchange_n(a, c, v, true, order(mo), failure_order(fmo));          \
  }                                                                                            \
  MHC_SP_HOOK T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int mo,       \
                                                        int fmo) {                             \
    __atomic_compare_exchange_n(a, &c, v, false, order(mo), failure_order(fmo));               \
    return c;                                                                                  \
  }

MHC_SP_ATOMIC_HOOKS(8, uint8_t)
MHC_SP_ATOMIC_HOOKS(16, uint16_t)
MHC_SP_ATOMIC_HOOKS(32, uint32_t)
MHC_SP_ATOMIC_HOOKS(64, uint64_t)

MHC_SP_HOOK void __tsan_atomic_thread_fence(int mo) { __atomic_thread_fence(order(mo)); }
MHC_SP_HOOK void __tsan_atomic_signal_fence(int mo) { __atomic_signal_fence(order(mo)); }
