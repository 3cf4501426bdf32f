// SPDX-License-Identifier: Apache-2.0
#pragma once
// The emulated device's internals, shared by its parts (not by the device sources, which see only
// emulation/device.h through the shim): the scheduler of a block's threads (scheduler.cpp), the
// memory model and its checks (memory.cpp, access_hooks.cpp), the PTX interpreter (ptx.cpp) and
// the streams and launches (streams.cpp).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "emulation/device.h"

namespace mhc_sp::emulation {

// A captured stream (streams.cpp): what it was given, in order, to run again.
struct Graph {
  int device = 0;
  std::vector<std::function<std::string()>> nodes;  // each returns a failure or ""
  // What was freed during the capture (device memory, host temporaries of the ops): kept, with
  // what it holds, for the replays; released with the graph.
  std::vector<std::function<void()>> releases;
  ~Graph();
};

}  // namespace mhc_sp::emulation

namespace mhc_sp::emulation::detail {

constexpr int kWarp = 32;

uint64_t now_ns();
// "file.cu:123" of a call site.
std::string site(const char* file, int line);

// ---- a launch in flight (streams.cpp owns it; the scheduler runs its blocks) --------------------

struct Launch {
  std::function<void()> body;  // owns the kernel's parameters
  dim3 grid, block;
  int device = 0;
  bool cooperative = false;
  uint64_t id = 0;    // the launch's number on its device since the last reset
  uint64_t seed = 0;  // the schedules of its blocks derive from it
  Schedule schedule = Schedule::kMixed;
  bool racecheck = true;
  bool delays = true;
  int lag_us = 0;  // the device's lag (configure_device)
  uint64_t deadline_ns = 0;

  std::atomic<bool> aborted{false};
  std::mutex m;
  std::string failure;  // the first failure of any block
  std::atomic<uint64_t> next_block{0};

  // Programmatic dependent launch: the grid this one depends on (its griddepcontrol.wait waits for
  // it), and how far this grid has come for its own dependents.
  std::shared_ptr<Launch> primary;
  std::atomic<uint64_t> blocks_started{0}, blocks_released{0};  // released: triggered or exited
  std::atomic<bool> dependents_released{false}, completed{false};
  // Blocks of this grid's programmatic dependent that have run up to their griddepcontrol.wait
  // or to their end (hostile PDL: a triggered block of this grid waits for one).
  std::atomic<uint64_t> dependent_blocks_parked{0};
  bool any_triggered = false;  // a block executed griddepcontrol.launch_dependents (under m)
  uint64_t start_ns = 0, end_ns = 0;

  std::condition_variable cv;  // completion and release, under m
  int workers_left = 0;

  void fail(const std::string& what);  // records the first failure and aborts the launch
  void mark_block_released();          // a block triggered its dependents or exited
};

// ---- the threads of a block
// -----------------------------------------------------------------------

#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
#else
}  // namespace mhc_sp::emulation::detail
#include <ucontext.h>
namespace mhc_sp::emulation::detail {
struct Context {
  ucontext_t uc;
};
#endif

enum class Wait : uint8_t { kReady, kBarrier, kWarp, kDone, kAbandoned };

struct Fiber {
  Context ctx;
  uint3 thread_idx{};
  Wait wait = Wait::kReady;
  const char* file = nullptr;  // where it waits
  int line = 0;
  bool polled = false;  // its last run ended in a poll (a spin-wait that found nothing yet)
  int barrier_result = 0;
  float warp_out[4] = {};
  int queue = 0, queue_pos = -1;  // which ready queue holds it (scheduler.cpp), and where
  void* stack = nullptr;          // kFiberStack bytes above a guard page
  void* tsan_fiber = nullptr;
  void* asan_fake_stack = nullptr;
  // The memory model's view of this thread (memory.cpp).
  const void* weak_pc = nullptr;  // the last weak load of system memory: where and what
  const void* weak_addr = nullptr;
  uint32_t weak_repeats = 0;
  Scope fence_scope = Scope::kNone;        // ThreadSanitizer's fence model: the widest fence yet
  std::vector<const void*> relaxed_reads;  // relaxed atomic reads since the last fence
  bool triggered = false;                  // executed griddepcontrol.launch_dependents
};

struct WarpOp {
  int arrived = 0;
  const char* name = nullptr;
  const char* file = nullptr;
  int line = 0;
  uint32_t in[kWarp][12] = {};
};

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
  }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
};

struct Block {
  uint3 block_idx{};
  Launch* launch = nullptr;
  std::vector<Fiber>* fibers = nullptr;
  int threads = 0, live = 0;
  Context scheduler;
  Fiber* running = nullptr;
  int bar_arrived = 0, bar_or = 0, bar_line = 0;
  const char* bar_file = nullptr;
  uint32_t barrier_epoch = 0;        // barriers completed in this block
  std::vector<uint32_t> warp_epoch;  // warp collectives completed, per warp
  std::vector<WarpOp> warps;
  bool failed = false;
  bool triggered = false;  // the block executed griddepcontrol.launch_dependents
  Schedule schedule = Schedule::kRandom;
  int chosen_warp = 0;  // the warp kWarpAhead runs first or kWarpBehind holds back
  Rng rng{1};
  uint64_t generation = 0;  // a number no other block run on this OS thread had (racecheck)
  int post_trigger_sleeps = 0;
  // A lagging device's block: it made an atomic store to system memory (an arrival, a push), then
  // polled (waited for its peers), and it has stalled.
  bool stored_system = false, waited_after_store = false, lagged = false;
  bool parked = false;  // a dependent grid's block: at its griddepcontrol.wait, or done
  // The scheduler's queues: ready threads per warp, the warps that have some, and the threads
  // whose last run ended in a poll.
  std::vector<std::vector<int>> ready_by_warp;
  std::vector<int> active_warps, active_pos, pollers;
  bool delays = true;
  const void* scheduler_stack = nullptr;  // ASan: the OS thread's own stack
  size_t scheduler_stack_size = 0;
  void* scheduler_tsan_fiber = nullptr;
  void* scheduler_fake_stack = nullptr;
};

// The block the calling OS thread runs (null outside a kernel), and its running thread.
Block* current_block();
inline Fiber* current_fiber() {
  Block* b = current_block();
  return b == nullptr ? nullptr : b->running;
}

// The running thread stops for good: its block and launch fail with `what` (outside a kernel:
// a c10::Error is thrown).
[[noreturn]] void abandon(const std::string& what);
// The running thread gives way to the other threads of its block. polled: it found nothing to do
// (a spin-wait); the scheduler then prefers threads that can progress.
void yield_thread(bool polled);

// Runs block `index` of `L` on the calling OS thread (scheduler.cpp).
void run_block(Launch& L, uint64_t index);

// mma.sync.m16n8k16 as a warp collective (scheduler.cpp): a, b0, b1 and c as the PTX operands.
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                  const float (&c)[4], const char* file, int line);

// ---- memory (memory.cpp) ----------------------------------------------------------------------

// The blocks' __shared__ memory, poisoned and checked for races (shared_memory.cpp): a block's
// start, and an access of the running thread (false: `addr` is not __shared__ memory).
void shared_block_begin(Block& b);
bool shared_access(Block& b, const void* addr, int bytes, bool write, const void* pc);
std::vector<std::pair<std::string, size_t>> shared_variables();
// Memory other devices or the host touch (system memory, memory.cpp): its name, or null.
const char* system_memory_name(const void* p, size_t bytes);
// A weak load of system memory by the running thread at `pc` (a poll through it is reported), and
// the delay a store to system memory may take.
// `at`: the PTX that loaded, or null for a plain C++ load at code address `pc`.
void weak_system_load(Fiber& f, const void* pc, const void* addr, const Site* at);
// "file:line (function)" of a code address of this module (shared_memory.cpp).
std::string code_site(const void* pc);
void system_store_delay();

// ---- launches (streams.cpp) ---------------------------------------------------------------------

// The launch the calling block belongs to, for griddepcontrol (ptx.cpp).
void launch_dependents();
void wait_for_primary();
// A block of the launch ended (its exit releases the launch's dependents as a trigger would).
void block_exited(Block& b);

}  // namespace mhc_sp::emulation::detail
