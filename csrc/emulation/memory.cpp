// SPDX-License-Identifier: Apache-2.0
// The emulated device's memory model (emulation/device.h): every load, store, read-modify-write
// and fence the PTX interpreter and CUDA's atomic intrinsics execute, as a C++ atomic operation at
// the order the PTX names (a .weak access is a plain one), with the checks a GPU's hardware would
// turn into silent corruption instead:
//  - scope: memory other devices or the host touch (system memory: a symm buffer every rank maps,
//    host-mapped memory) needs .sys on every atomic access;
//  - polls: a spin-wait on system memory must load atomically; a thread that repeats the same weak
//    load of it is reported;
//  - delays: stores to system memory and polls give way to other threads now and then (seeded),
//    so that a protocol that needs a store to land "soon" shows it.
// Under ThreadSanitizer (scripts/sanitize.sh thread) the orders are judged as written: relaxed is
// relaxed. ThreadSanitizer ignores standalone fences, so this file models them with its
// synchronisation annotations (see "the ThreadSanitizer fence model" below), scopes included: a
// fence narrower than .sys does not synchronise with another device. The release is taken at the
// relaxed write that follows the fence rather than at the fence: a store between the fence and
// the flag counts as ordered (docs/emulation.md).

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "emulation/internal.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace mhc_sp::emulation {
namespace detail {
namespace {

// A thread that loads the same system-memory word this many times in a row with weak loads, with
// no synchronisation point between, is polling it. (A spinning fiber gives way at every load, so
// a peer that is late by a millisecond sees only a few hundred of its loads.)
constexpr uint32_t kWeakPollRepeats = 128;

// ---- system memory: a sorted snapshot, replaced (never changed) when a range comes or goes ------

struct Range {
  uintptr_t begin, end;
  std::string name;
};
using Ranges = std::vector<Range>;

std::mutex ranges_mutex;
std::atomic<const Ranges*> ranges{new Ranges()};
std::vector<const Ranges*> retired;  // old snapshots: a kernel may still read one

void publish(Ranges next) {
  std::sort(next.begin(), next.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  retired.push_back(ranges.exchange(new Ranges(std::move(next))));
}

const char* order_name(Sem s) {
  switch (s) {
    case Sem::kWeak: return ".weak";
    case Sem::kVolatile: return ".volatile";
    case Sem::kRelaxed: return ".relaxed";
    case Sem::kAcquire: return ".acquire";
    case Sem::kRelease: return ".release";
    case Sem::kAcqRel: return ".acq_rel";
    case Sem::kSc: return ".sc";
  }
  return "?";
}

const char* scope_name(Scope s) {
  switch (s) {
    case Scope::kNone: return "no scope";
    case Scope::kCta: return ".cta";
    case Scope::kGpu: return ".gpu";
    case Scope::kSys: return ".sys";
  }
  return "?";
}

std::string where(const Site& at) {
  return "'" + std::string(at.what) + "' at " + site(at.file, at.line);
}

int gcc_order(Sem s) {
  switch (s) {
    case Sem::kAcquire: return __ATOMIC_ACQUIRE;
    case Sem::kRelease: return __ATOMIC_RELEASE;
    case Sem::kAcqRel: return __ATOMIC_ACQ_REL;
    case Sem::kSc: return __ATOMIC_SEQ_CST;
    default: return __ATOMIC_RELAXED;  // .relaxed, .volatile
  }
}

void check_size(const void* p, int bytes, const Site& at) {
  if (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8) {
    abandon("a memory access of " + std::to_string(bytes) + " bytes by " + where(at));
  }
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) {
    abandon("a misaligned " + std::to_string(bytes) + "-byte access by " + where(at) +
            " (the GPU raises a misaligned address error)");
  }
}

// An atomic access to system memory must be .sys-scoped.
void check_scope(const void* p, int bytes, Sem sem, Scope scope, const Site& at) {
  const char* name = system_memory_name(p, bytes);
  if (name == nullptr || sem == Sem::kVolatile || scope == Scope::kSys) return;
  abandon(where(at) + " is " + order_name(sem) + " at " + scope_name(scope) + " on " + name +
          ", which other devices or the host access: that needs .sys scope");
}

// ---- the ThreadSanitizer fence model (see the file's comment)
// ------------------------------------ A release fence followed by a relaxed write of p releases
// into a synchronisation object of p per scope: p's own for .sys, p's on this device for .gpu (and
// .cta: blocks are not modelled apart). A relaxed read of p followed by an acquire fence acquires
// from p itself (a release store), from p's object on this device and, for a .sys fence, from p's
// .sys object; an acquire load of p does the same at its own scope. So a fence narrower than .sys
// synchronises with this device's threads only, as on the GPU.

#if defined(__SANITIZE_THREAD__)
char sync_objects[1 << 20];  // addresses for ThreadSanitizer's synchronisation objects only

void* sync_object(const void* p, int key) {
  uint64_t h = reinterpret_cast<uintptr_t>(p) * 0x9e3779b97f4a7c15ull +
               uint64_t(key + 1) * 0xc2b2ae3d27d4eb4full;
  h ^= h >> 29;
  return &sync_objects[(h % (sizeof(sync_objects) / 8)) * 8];
}

constexpr int kSysKey = -1;

int device_key() {
  Block* b = current_block();
  return b == nullptr ? -2 : b->launch->device;
}

void acquire_at(const void* p, Scope scope) {
  __tsan_acquire(const_cast<void*>(p));
  __tsan_acquire(sync_object(p, device_key()));
  if (scope == Scope::kSys) __tsan_acquire(sync_object(p, kSysKey));
}
#endif

// Before a relaxed write of p.
void model_relaxed_write(void* p, Sem sem) {
#if defined(__SANITIZE_THREAD__)
  Fiber* f = current_fiber();
  if (f == nullptr || f->fence_scope == Scope::kNone) return;
  if (sem != Sem::kRelaxed && sem != Sem::kVolatile) return;
  __tsan_release(sync_object(p, device_key()));
  if (f->fence_scope == Scope::kSys) __tsan_release(sync_object(p, kSysKey));
#else
  (void)p, (void)sem;
#endif
}

// After a read of p: a relaxed one is remembered for the next fence; an acquire one acquires
// what fences released into p's objects.
void model_read(const void* p, Sem sem, Scope scope) {
#if defined(__SANITIZE_THREAD__)
  Fiber* f = current_fiber();
  if (f == nullptr) return;
  if (sem == Sem::kAcquire || sem == Sem::kAcqRel || sem == Sem::kSc) {
    acquire_at(p, scope);
    return;
  }
  auto& r = f->relaxed_reads;
  if (std::find(r.begin(), r.end(), p) == r.end()) {
    if (r.size() >= 64) r.erase(r.begin());
    r.push_back(p);
  }
#else
  (void)p, (void)sem, (void)scope;
#endif
}

uint64_t atomic_load(const void* p, int bytes, int order) {
  switch (bytes) {
    case 1: return __atomic_load_n(static_cast<const uint8_t*>(p), order);
    case 2: return __atomic_load_n(static_cast<const uint16_t*>(p), order);
    case 4: return __atomic_load_n(static_cast<const uint32_t*>(p), order);
    default: return __atomic_load_n(static_cast<const uint64_t*>(p), order);
  }
}

void atomic_store(void* p, int bytes, uint64_t v, int order) {
  switch (bytes) {
    case 1: __atomic_store_n(static_cast<uint8_t*>(p), uint8_t(v), order); break;
    case 2: __atomic_store_n(static_cast<uint16_t*>(p), uint16_t(v), order); break;
    case 4: __atomic_store_n(static_cast<uint32_t*>(p), uint32_t(v), order); break;
    default: __atomic_store_n(static_cast<uint64_t*>(p), v, order); break;
  }
}

template <typename T>
T apply(Rmw op, T old, T operand, T compare) {
  switch (op) {
    case Rmw::kAdd: return T(old + operand);
    case Rmw::kExch: return operand;
    case Rmw::kCas: return old == compare ? operand : old;
    case Rmw::kAnd: return T(old & operand);
    case Rmw::kOr: return T(old | operand);
    case Rmw::kXor: return T(old ^ operand);
    case Rmw::kMin: return std::min(old, operand);
    case Rmw::kMax: return std::max(old, operand);
    case Rmw::kInc: return old >= operand ? T(0) : T(old + 1);
    case Rmw::kDec: return (old == 0 || old > operand) ? operand : T(old - 1);
    case Rmw::kAddF32: {
      float f, g;
      const uint32_t o = uint32_t(old), a = uint32_t(operand);
      std::memcpy(&f, &o, 4);
      std::memcpy(&g, &a, 4);
      f += g;
      uint32_t r;
      std::memcpy(&r, &f, 4);
      return T(r);
    }
  }
  return old;
}

// A read-modify-write as a compare-exchange loop at `order` (every PTX atom fits it).
template <typename T>
uint64_t atomic_rmw(Rmw op, T* p, T operand, T compare, int order) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  for (;;) {
    const T next = apply<T>(op, old, operand, compare);
    if (op == Rmw::kCas && next == old) {
      // A failed (or no-op) compare-and-swap is a load at the order's read part.
      const int read = order == __ATOMIC_RELEASE   ? __ATOMIC_RELAXED
                       : order == __ATOMIC_ACQ_REL ? __ATOMIC_ACQUIRE
                                                   : order;
      if (__atomic_compare_exchange_n(p, &old, next, false, order, read)) return old;
      if (old != compare) return old;
      continue;
    }
    const int fail = order == __ATOMIC_RELEASE   ? __ATOMIC_RELAXED
                     : order == __ATOMIC_ACQ_REL ? __ATOMIC_ACQUIRE
                                                 : order;
    if (__atomic_compare_exchange_n(p, &old, next, false, order, fail)) return old;
  }
}

}  // namespace

const char* system_memory_name(const void* p, size_t bytes) {
  const Ranges& r = *ranges.load(std::memory_order_acquire);
  if (r.empty()) return nullptr;
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = std::upper_bound(r.begin(), r.end(), a,
                             [](uintptr_t v, const Range& x) { return v < x.begin; });
  if (it == r.begin()) return nullptr;
  --it;
  return a + bytes <= it->end ? it->name.c_str() : nullptr;
}

// A weak load of system memory by the running thread: repeated at the same site and address with
// no synchronisation point between, it is a poll through a weak load.
void weak_system_load(Fiber& f, const void* pc, const void* addr, const Site* at) {
  if (f.weak_pc == pc && f.weak_addr == addr) {
    if (++f.weak_repeats == kWeakPollRepeats) {
      const std::string what = at != nullptr ? where(*at) : "the load at " + code_site(pc);
      abandon("a poll through a weak (non-atomic) load: " + what + " loaded " +
              system_memory_name(addr, 1) + " " + std::to_string(kWeakPollRepeats) +
              " times in a row; a spin-wait must use ld.relaxed/ld.acquire (.sys), or the GPU "
              "may never see the peer's store");
    }
    return;
  }
  f.weak_pc = pc;
  f.weak_addr = addr;
  f.weak_repeats = 1;
}

// A store to system memory: now and then the thread gives way first (seeded), so that whoever
// waits for it runs meanwhile; rarely the whole block stalls for a while (a store that takes
// the long way), so that a peer reading what this block stores sees the stores before it landed
// and the ones after it not yet.
void system_store_delay() {
  Block* b = current_block();
  if (b == nullptr || b->running == nullptr || !b->delays) return;
  const uint64_t r = b->rng.below(256);
  if (r == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  } else if (r < 16) {
    yield_thread(false);
  }
}

// After a read-modify-write (an arrival counter, a claim): now and then the block stalls, so that
// the block that sees the count complete runs while this block's other warps have not moved on.
void rmw_delay() {
  Block* b = current_block();
  if (b == nullptr || b->running == nullptr || !b->delays) return;
  if (b->rng.below(8) == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

}  // namespace detail

using detail::abandon;
using detail::current_fiber;
using detail::Fiber;

namespace {

// The ranges without the one starting at p, plus [p, p + bytes) when bytes > 0, published anew.
void replace_system_memory(const void* p, size_t bytes, const std::string& name) {
  const std::lock_guard<std::mutex> lock(detail::ranges_mutex);
  detail::Ranges next = *detail::ranges.load();
  const auto a = reinterpret_cast<uintptr_t>(p);
  next.erase(std::remove_if(next.begin(), next.end(),
                            [&](const detail::Range& r) { return r.begin == a; }),
             next.end());
  if (bytes > 0) next.push_back({a, a + bytes, name});
  detail::publish(std::move(next));
}

}  // namespace

void add_system_memory(const void* p, size_t bytes, const std::string& name) {
  replace_system_memory(p, bytes, name);
}

void remove_system_memory(const void* p) { replace_system_memory(p, 0, ""); }

uint64_t mem_load(const void* p, int bytes, Sem sem, Scope scope, const Site& at, bool poll_first) {
  detail::check_size(p, bytes, at);
  if (sem == Sem::kRelease || sem == Sem::kAcqRel) {
    abandon(detail::where(at) + ": a load cannot be " + detail::order_name(sem));
  }
  if (sem == Sem::kWeak) {
    Fiber* f = current_fiber();
    // A vector load counts once, by its first element (poll_first), so that repeating it is
    // repeating one load of one address.
    if (f != nullptr && poll_first && detail::system_memory_name(p, bytes) != nullptr) {
      detail::weak_system_load(*f, at.what, p, &at);
    }
    uint64_t v = 0;
    std::memcpy(&v, p, bytes);
    return v;
  }
  detail::check_scope(p, bytes, sem, scope, at);
  // An atomic load is what a spin-wait polls with: the threads it waits for run first.
  if (poll_first) poll();
  const uint64_t v = detail::atomic_load(p, bytes, detail::gcc_order(sem));
  detail::model_read(p, sem, scope);
  return v;
}

void mem_store(void* p, int bytes, uint64_t v, Sem sem, Scope scope, const Site& at) {
  detail::check_size(p, bytes, at);
  if (sem == Sem::kAcquire || sem == Sem::kAcqRel) {
    abandon(detail::where(at) + ": a store cannot be " + detail::order_name(sem));
  }
  const bool system = detail::system_memory_name(p, bytes) != nullptr;
  if (system) detail::system_store_delay();
  if (system && sem != Sem::kWeak) {  // an arrival, a push: what a lagging rank stalls after
    if (detail::Block* b = detail::current_block(); b != nullptr) b->stored_system = true;
  }
  if (sem == Sem::kWeak) {
    std::memcpy(p, &v, bytes);
    return;
  }
  detail::check_scope(p, bytes, sem, scope, at);
  detail::model_relaxed_write(p, sem);
  detail::atomic_store(p, bytes, v, detail::gcc_order(sem));
}

uint64_t mem_rmw(Rmw op, void* p, int bytes, uint64_t operand, uint64_t compare, Sem sem,
                 Scope scope, const Site& at) {
  detail::check_size(p, bytes, at);
  if (bytes != 4 && bytes != 8) abandon(detail::where(at) + ": atom/red take 32 or 64 bits");
  if (sem == Sem::kWeak) sem = Sem::kRelaxed;  // atom without an order is .relaxed
  detail::check_scope(p, bytes, sem, scope, at);
  detail::model_relaxed_write(p, sem);
  const int order = detail::gcc_order(sem);
  const uint64_t old =
      bytes == 4
          ? detail::atomic_rmw<uint32_t>(op, static_cast<uint32_t*>(p), uint32_t(operand),
                                         uint32_t(compare), order)
          : detail::atomic_rmw<uint64_t>(op, static_cast<uint64_t*>(p), operand, compare, order);
  detail::model_read(p, sem, scope);
  detail::rmw_delay();
  return old;
}

void mem_fence(Sem sem, Scope scope, const Site& at) {
  if (sem != Sem::kAcqRel && sem != Sem::kSc) {
    abandon(detail::where(at) + ": a fence is .acq_rel or .sc");
  }
  std::atomic_thread_fence(sem == Sem::kSc ? std::memory_order_seq_cst : std::memory_order_acq_rel);
#if defined(__SANITIZE_THREAD__)
  Fiber* f = current_fiber();
  if (f == nullptr) return;
  for (const void* p : f->relaxed_reads) detail::acquire_at(p, scope);
  f->relaxed_reads.clear();
  if (f->fence_scope != Scope::kSys) f->fence_scope = scope;
#else
  (void)scope;
#endif
}

}  // namespace mhc_sp::emulation
