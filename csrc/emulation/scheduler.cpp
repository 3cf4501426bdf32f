// SPDX-License-Identifier: Apache-2.0
// The threads of an emulated block (emulation/device.h): fibers on the block's OS thread, run one
// at a time to their next synchronisation point in an order the block's schedule draws from the
// seed; barriers over the block, warp collectives over 32 lanes (the shuffle and the MMA), polls,
// and the reports of what cannot go on (deadlocks, divergent barriers, partial warps).

#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <thread>

#include "emulation/internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

// A fiber's first function, and (x86-64) the stack switch and the start of a fresh stack, in
// assembly below.
extern "C" {
__attribute__((visibility("hidden"))) void mhc_sp_emulation_fiber_main();
__attribute__((visibility("hidden"))) void mhc_sp_emulation_switch(void** save_sp, void* next_sp);
__attribute__((visibility("hidden"))) void mhc_sp_emulation_fiber_start();
}

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace mhc_sp::emulation {
namespace detail {

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kFiberStack = size_t(1) << 20;  // ASan's redzones need room
#else
constexpr size_t kFiberStack = size_t(256) << 10;
#endif

thread_local Block* this_block = nullptr;

// ---- stack switching
// ------------------------------------------------------------------------------ On x86-64 a switch
// saves the callee-saved registers on the old stack and moves to the new one (what a function call
// must preserve: the fibers switch only inside calls); elsewhere ucontext, whose swapcontext also
// saves the signal mask with a system call on every switch.

#if defined(__x86_64__)
asm(R"(
  .text
  .p2align 4
  .hidden mhc_sp_emulation_switch
  .type mhc_sp_emulation_switch, @function
mhc_sp_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size mhc_sp_emulation_switch, .-mhc_sp_emulation_switch
  .hidden mhc_sp_emulation_fiber_start
  .type mhc_sp_emulation_fiber_start, @function
mhc_sp_emulation_fiber_start:
  andq $-16, %rsp
  call mhc_sp_emulation_fiber_main
  ud2
  .size mhc_sp_emulation_fiber_start, .-mhc_sp_emulation_fiber_start
)");

void switch_context(Context& from, const Context& to) { mhc_sp_emulation_switch(&from.sp, to.sp); }

// A fresh context that starts in mhc_sp_emulation_fiber_main on `stack`.
void make_context(Context& c, void* stack, size_t size) {
  auto* top =
      reinterpret_cast<uintptr_t*>((reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15));
  *--top = 0;  // keeps the start's stack as a call would leave it
  *--top = reinterpret_cast<uintptr_t>(&mhc_sp_emulation_fiber_start);  // where `ret` goes
  for (int r = 0; r < 6; ++r) *--top = 0;                               // rbp, rbx, r12-r15
  c.sp = top;
}
#else
void switch_context(Context& from, const Context& to) { swapcontext(&from.uc, &to.uc); }

void make_context(Context& c, void* stack, size_t size) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, mhc_sp_emulation_fiber_main, 0);
}
#endif

// The sanitizers' view of a stack switch (no-ops in a normal build).
void before_switch(void** fake_stack_save, const void* bottom, size_t size, void* tsan_to) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
#else
  (void)fake_stack_save, (void)bottom, (void)size;
#endif
#if defined(__SANITIZE_THREAD__)
  __tsan_switch_to_fiber(tsan_to, 0);
#else
  (void)tsan_to;
#endif
}

void after_switch(void* fake_stack_save, const void** old_bottom, size_t* old_size) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake_stack_save, old_bottom, old_size);
#else
  (void)fake_stack_save, (void)old_bottom, (void)old_size;
#endif
}

// From the running fiber back to its block's scheduler; returns when the scheduler resumes it.
void to_scheduler(Fiber& f, bool dying = false) {
  Block& b = *this_block;
  before_switch(dying ? nullptr : &f.asan_fake_stack, b.scheduler_stack, b.scheduler_stack_size,
                b.scheduler_tsan_fiber);
  switch_context(f.ctx, b.scheduler);
  after_switch(f.asan_fake_stack, &b.scheduler_stack, &b.scheduler_stack_size);
}

void run_fiber(Block& b, Fiber& f) {
  b.running = &f;
  threadIdx = f.thread_idx;
  before_switch(&b.scheduler_fake_stack, f.stack, kFiberStack, f.tsan_fiber);
  switch_context(b.scheduler, f.ctx);
  after_switch(b.scheduler_fake_stack, nullptr, nullptr);
  b.running = nullptr;
}

// ---- the ready queues
// ----------------------------------------------------------------------------- Fiber::queue: 0 in
// none, 1 in its warp's ready list, 2 among the pollers.

int index_of(const Block& b, const Fiber& f) { return static_cast<int>(&f - b.fibers->data()); }

void enqueue(Block& b, Fiber& f) {
  if (f.queue != 0) return;
  const int t = index_of(b, f);
  if (f.polled) {
    f.queue = 2;
    f.queue_pos = static_cast<int>(b.pollers.size());
    b.pollers.push_back(t);
    return;
  }
  const int w = t / kWarp;
  auto& q = b.ready_by_warp[w];
  f.queue = 1;
  f.queue_pos = static_cast<int>(q.size());
  q.push_back(t);
  if (b.active_pos[w] < 0) {
    b.active_pos[w] = static_cast<int>(b.active_warps.size());
    b.active_warps.push_back(w);
  }
}

void dequeue_ready(Block& b, Fiber& f) {
  const int t = index_of(b, f), w = t / kWarp;
  auto& q = b.ready_by_warp[w];
  const int last = q.back();
  q[f.queue_pos] = last;
  (*b.fibers)[last].queue_pos = f.queue_pos;
  q.pop_back();
  f.queue = 0;
  f.queue_pos = -1;
  if (q.empty()) {
    const int pos = b.active_pos[w], moved = b.active_warps.back();
    b.active_warps[pos] = moved;
    b.active_pos[moved] = pos;
    b.active_warps.pop_back();
    b.active_pos[w] = -1;
  }
}

// The next thread to run under the block's schedule, or -1 when no thread is ready (every one
// waits at a barrier or a collective, or polled last time).
int pick(Block& b) {
  if (b.active_warps.empty()) return -1;
  const auto random_warp = [&] { return b.active_warps[b.rng.below(b.active_warps.size())]; };
  int w = 0;
  switch (b.schedule) {
    case Schedule::kWarpAhead:
      w = b.active_pos[b.chosen_warp] >= 0 ? b.chosen_warp : random_warp();
      break;
    case Schedule::kWarpBehind: {
      const size_t n = b.active_warps.size();
      size_t i = b.rng.below(n);
      if (b.active_warps[i] == b.chosen_warp && n > 1) i = (i + 1) % n;
      w = b.active_warps[i];
      break;
    }
    case Schedule::kInOrder:
      w = *std::min_element(b.active_warps.begin(), b.active_warps.end());
      break;
    default: w = random_warp(); break;
  }
  const auto& q = b.ready_by_warp[w];
  if (b.schedule == Schedule::kInOrder) return *std::min_element(q.begin(), q.end());
  return q[b.rng.below(q.size())];
}

// Every thread that waits at the block's barrier continues (it is complete).
void release_barrier(Block& b) {
  for (Fiber& o : *b.fibers) {
    if (&o - b.fibers->data() >= b.threads) break;
    if (o.wait == Wait::kBarrier) {
      o.wait = Wait::kReady;
      o.barrier_result = b.bar_or;
      enqueue(b, o);
    }
  }
  b.bar_arrived = 0;
  ++b.barrier_epoch;
  // A lagging device (configure_device): the first barrier after the block stored to system memory
  // (an arrival, a push) and then polled for its peers.
  if (b.launch->lag_us > 0 && b.waited_after_store && !b.lagged) {
    b.lagged = true;
    std::this_thread::sleep_for(std::chrono::microseconds(b.launch->lag_us));
  }
}

// What every thread of a block that can no longer progress waits for, grouped by site.
std::string deadlock_report(const Block& b) {
  std::map<std::string, std::vector<int>> by_site;
  int done = 0;
  for (int t = 0; t < b.threads; ++t) {
    const Fiber& f = (*b.fibers)[t];
    if (f.wait == Wait::kDone) {
      ++done;
    } else if (f.wait == Wait::kBarrier) {
      by_site["__syncthreads at " + site(f.file, f.line)].push_back(t);
    } else if (f.wait == Wait::kWarp) {
      by_site["a warp collective at " + site(f.file, f.line)].push_back(t);
    }
  }
  std::ostringstream s;
  s << "deadlock: no thread can continue;";
  for (const auto& [where, ts] : by_site) {
    s << " " << ts.size() << " thread(s) (first " << ts.front() << ") wait at " << where << ";";
  }
  s << " " << done << " thread(s) have exited";
  return s.str();
}

// Fibers and their stacks, kept by an OS thread across the blocks it runs.
struct FiberPool {
  std::vector<Fiber> fibers;
  ~FiberPool() {
    for (Fiber& f : fibers) {
      if (f.stack != nullptr) munmap(static_cast<char*>(f.stack) - 4096, kFiberStack + 4096);
    }
  }
  void reserve(int n) {
    if (static_cast<int>(fibers.size()) >= n) return;
    fibers.resize(n);
    for (Fiber& f : fibers) {
      if (f.stack != nullptr) continue;
      void* p = mmap(nullptr, kFiberStack + 4096, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      TORCH_CHECK(p != MAP_FAILED, "emulation: cannot map a fiber stack");
      mprotect(p, 4096, PROT_NONE);  // an overflow faults instead of corrupting a neighbour
      f.stack = static_cast<char*>(p) + 4096;
    }
  }
};

thread_local FiberPool pool;

uint64_t mix(uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

void fail_block(Block& b, const std::string& what) {
  b.failed = true;
  std::ostringstream s;
  s << "block (" << b.block_idx.x << ", " << b.block_idx.y << ") of a grid of (" << b.launch->grid.x
    << ", " << b.launch->grid.y << ") x " << b.launch->block.x << " threads: " << what;
  b.launch->fail(s.str());
}

}  // namespace

Block* current_block() { return this_block; }

void abandon(const std::string& what) {
  Block* b = this_block;
  if (b == nullptr || b->running == nullptr) TORCH_CHECK(false, "emulation: ", what);
  Fiber& f = *b->running;
  fail_block(*b, what);
  f.wait = Wait::kAbandoned;
  to_scheduler(f);
  std::abort();  // never resumed
}

void yield_thread(bool polled) {
  Block* b = this_block;
  if (b == nullptr || b->running == nullptr) return;  // host code: nothing to give way to
  b->running->polled = polled;
  to_scheduler(*b->running);
}

// The first code a fiber runs (mhc_sp_emulation_fiber_main below enters here).
void fiber_main() {
  Block& b = *this_block;
  Fiber& f = *b.running;
  after_switch(nullptr, &b.scheduler_stack, &b.scheduler_stack_size);
  b.launch->body();
  f.wait = Wait::kDone;
  --b.live;
  // Exited threads no longer hold a barrier.
  if (b.bar_arrived > 0 && b.bar_arrived == b.live) release_barrier(b);
  to_scheduler(f, true);
  std::abort();  // a finished fiber is never resumed
}

void run_block(Launch& L, uint64_t index) {
  Block b;
  b.block_idx =
      uint3{static_cast<unsigned>(index % L.grid.x), static_cast<unsigned>(index / L.grid.x), 0};
  blockIdx = b.block_idx;
  blockDim = L.block;
  gridDim = L.grid;
  b.launch = &L;
  b.threads = static_cast<int>(L.block.x);
  b.live = b.threads;
  const int warps = (b.threads + kWarp - 1) / kWarp;
  b.warps.resize(warps);
  b.warp_epoch.assign(warps, 0);
  b.ready_by_warp.resize(warps);
  b.active_pos.assign(warps, -1);
  b.rng.s = mix(L.seed ^ mix(L.id * 0x9e3779b97f4a7c15ull + index + 1)) | 1;
  b.schedule = L.schedule;
  b.delays = L.delays;
  b.stored_system = b.waited_after_store = b.lagged = b.parked = false;
  if (b.schedule == Schedule::kMixed) {
    static constexpr Schedule kDrawn[] = {Schedule::kRandom, Schedule::kWarpAhead,
                                          Schedule::kWarpBehind, Schedule::kInOrder};
    b.schedule = kDrawn[b.rng.below(4)];
  }
  b.chosen_warp = static_cast<int>(b.rng.below(warps));
  pool.reserve(b.threads);
  b.fibers = &pool.fibers;
  this_block = &b;
  shared_block_begin(b);
#if defined(__SANITIZE_THREAD__)
  b.scheduler_tsan_fiber = __tsan_get_current_fiber();
#endif
  for (int t = 0; t < b.threads; ++t) {
    Fiber& f = pool.fibers[t];
    f.thread_idx = uint3{static_cast<unsigned>(t), 0, 0};
    f.wait = Wait::kReady;
    f.polled = false;
    f.queue = 0;
    f.queue_pos = -1;
    f.asan_fake_stack = nullptr;
    f.weak_pc = f.weak_addr = nullptr;
    f.weak_repeats = 0;
    f.fence_scope = Scope::kNone;
    f.relaxed_reads.clear();
    f.triggered = false;
#if defined(__SANITIZE_ADDRESS__)
    __asan_unpoison_memory_region(f.stack, kFiberStack);  // frames an abandoned fiber left
#endif
#if defined(__SANITIZE_THREAD__)
    f.tsan_fiber = __tsan_create_fiber(0);
#endif
    make_context(f.ctx, f.stack, kFiberStack);
    enqueue(b, f);
  }
  int idle = 0;
  bool progress = true;
  for (uint64_t step = 0; b.live > 0 && !b.failed; ++step) {
    if (L.aborted.load(std::memory_order_relaxed)) break;  // another block failed, or timed out
    if ((step & 255) == 0 && now_ns() > L.deadline_ns) {
      fail_block(b, "the launch ran past the emulation's launch timeout (a wait that never ends?)");
      break;
    }
    // A primary grid that let its dependents start gives them a head start (hostile PDL): a
    // block that triggered waits, up to 10 ms, until a block of the dependent has run all it
    // runs before its griddepcontrol.wait (or to its end, when it has none): the host has to
    // launch it and a worker to run it, which a loaded host takes a while to do. Then it lets the
    // dependent's other blocks run a while before it goes on.
    if (b.triggered && b.post_trigger_sleeps < 203) {
      const bool dependent_ran = L.dependent_blocks_parked.load() > 0;
      if (!dependent_ran && b.post_trigger_sleeps < 200) {
        ++b.post_trigger_sleeps;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else if (dependent_ran) {
        b.post_trigger_sleeps = std::max(b.post_trigger_sleeps, 200) + 1;
        std::this_thread::sleep_for(std::chrono::microseconds(40));
      }
    }
    const int t = pick(b);
    if (t < 0) {
      if (b.pollers.empty()) {
        fail_block(b, deadlock_report(b));
        break;
      }
      // Every ready thread polls: a new round of polls, after letting the other blocks run.
      if (progress) {
        idle = 0;
      } else if (++idle < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      progress = false;
      std::vector<int> again;
      again.swap(b.pollers);
      for (int p : again) {
        Fiber& o = pool.fibers[p];
        o.queue = 0;
        o.polled = false;
        enqueue(b, o);
      }
      continue;
    }
    Fiber& f = pool.fibers[t];
    dequeue_ready(b, f);
    f.polled = false;
    run_fiber(b, f);
    if (f.wait == Wait::kReady) {
      enqueue(b, f);
      progress |= !f.polled;
    } else {
      progress = true;
    }
  }
#if defined(__SANITIZE_THREAD__)
  for (int t = 0; t < b.threads; ++t) __tsan_destroy_fiber(pool.fibers[t].tsan_fiber);
#endif
  // Now and then (seeded) a block is slow to retire, as a GPU's blocks end at different times:
  // the grid then ends late, and a peer rank gets further into its next call meanwhile.
  if (b.delays && !b.failed && b.rng.below(4) == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  block_exited(b);
  this_block = nullptr;
}

// ---- warp collectives
// -------------------------------------------------------------------------------

namespace {

// Lane `lane` of the running thread's warp arrives at collective `name` with `words` inputs; when
// the 32nd lane arrives, finish(op) computes every lane's result (into their fibers' warp_out).
template <class Finish>
void warp_collective(const char* name, const char* file, int line, const uint32_t* in, int words,
                     Finish&& finish) {
  Block& b = *this_block;
  Fiber& f = *b.running;
  const int t = static_cast<int>(f.thread_idx.x);
  WarpOp& op = b.warps[t / kWarp];
  f.weak_repeats = 0;  // a synchronisation point: a weak load repeated after it is no poll
  if (op.arrived == 0) {
    op.name = name;
    op.file = file;
    op.line = line;
  } else if (op.line != line || std::strcmp(op.file, file) != 0 || op.name != name) {
    abandon(std::string("lanes of warp ") + std::to_string(t / kWarp) + " diverge: " + op.name +
            " at " + site(op.file, op.line) + ", " + name + " at " + site(file, line));
  }
  std::memcpy(op.in[t % kWarp], in, sizeof(uint32_t) * words);
  ++op.arrived;
  f.wait = Wait::kWarp;
  f.file = file;
  f.line = line;
  if (op.arrived == kWarp) {
    Fiber* lanes = &(*b.fibers)[t / kWarp * kWarp];
    finish(op, lanes);
    for (int l = 0; l < kWarp; ++l) {
      lanes[l].wait = Wait::kReady;
      enqueue(b, lanes[l]);
    }
    op.arrived = 0;
    ++b.warp_epoch[t / kWarp];
  }
  to_scheduler(f);
}

float bits_float(uint32_t v) {
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}

uint32_t float_bits(float f) {
  uint32_t v;
  std::memcpy(&v, &f, 4);
  return v;
}

float bf16_lo(uint32_t w) { return bits_float(w << 16); }
float bf16_hi(uint32_t w) { return bits_float(w & 0xffff0000u); }

}  // namespace

void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                  const float (&c)[4], const char* file, int line) {
  Fiber& f = *this_block->running;
  const uint32_t in[10] = {a[0],
                           a[1],
                           a[2],
                           a[3],
                           b0,
                           b1,
                           float_bits(c[0]),
                           float_bits(c[1]),
                           float_bits(c[2]),
                           float_bits(c[3])};
  warp_collective("mma.m16n8k16", file, line, in, 10, [](WarpOp& op, Fiber* lanes) {
    // The fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"):
    // lane = 4 * group + index; A's registers hold (row group | group + 8, columns 2 index (+1),
    // +8 for the last two registers); B's hold (rows 2 index (+1), +8 for the second; column
    // group); C and D hold (row group | group + 8, columns 2 index (+1)).
    float A[16][16], B[16][8];
    for (int lane = 0; lane < kWarp; ++lane) {
      const int g = lane / 4, i = lane % 4;
      const uint32_t* r = op.in[lane];
      const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * i, 2 * i, 2 * i + 8, 2 * i + 8};
      for (int q = 0; q < 4; ++q) {
        A[rows[q]][cols[q]] = bf16_lo(r[q]);
        A[rows[q]][cols[q] + 1] = bf16_hi(r[q]);
      }
      B[2 * i][g] = bf16_lo(r[4]);
      B[2 * i + 1][g] = bf16_hi(r[4]);
      B[2 * i + 8][g] = bf16_lo(r[5]);
      B[2 * i + 9][g] = bf16_hi(r[5]);
    }
    for (int lane = 0; lane < kWarp; ++lane) {
      const int g = lane / 4, i = lane % 4;
      const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * i, 2 * i + 1, 2 * i, 2 * i + 1};
      for (int e = 0; e < 4; ++e) {
        double s = 0;  // bf16 x bf16 products are exact; 16 of them in double, rounded once
        for (int k = 0; k < 16; ++k) s += double(A[rows[e]][k]) * double(B[k][cols[e]]);
        lanes[lane].warp_out[e] = static_cast<float>(s + double(bits_float(op.in[lane][6 + e])));
      }
    }
  });
  for (int e = 0; e < 4; ++e) d[e] = f.warp_out[e];
}

}  // namespace detail

// ---- synchronisation points
// -----------------------------------------------------------------------

using detail::Block;
using detail::Fiber;
using detail::Wait;

int syncthreads_or(int predicate, const char* file, int line) {
  Block& b = *detail::this_block;
  Fiber& f = *b.running;
  if (b.bar_arrived == 0) {
    b.bar_file = file;
    b.bar_line = line;
    b.bar_or = 0;
  } else if (b.bar_line != line || std::strcmp(b.bar_file, file) != 0) {
    detail::abandon("threads reach different barriers: __syncthreads at " +
                    detail::site(b.bar_file, b.bar_line) + " and at " + detail::site(file, line) +
                    " (a barrier in divergent code)");
  }
  b.bar_or |= predicate;
  ++b.bar_arrived;
  f.weak_repeats = 0;  // a synchronisation point: a weak load repeated after it is no poll
  f.wait = Wait::kBarrier;
  f.file = file;
  f.line = line;
  if (b.bar_arrived == b.live) detail::release_barrier(b);
  detail::to_scheduler(f);
  return f.barrier_result;
}

void syncthreads(const char* file, int line) { syncthreads_or(0, file, line); }

float shfl_xor(unsigned mask, float value, int lane_mask, const char* file, int line) {
  Fiber& f = *detail::this_block->running;
  if (mask != 0xffffffffu) detail::abandon("the emulation supports full-warp shuffles only");
  const uint32_t in[2] = {detail::float_bits(value), static_cast<uint32_t>(lane_mask)};
  detail::warp_collective(
      "__shfl_xor_sync", file, line, in, 2, [](detail::WarpOp& op, Fiber* lanes) {
        for (int l = 0; l < detail::kWarp; ++l) {
          const int src = l ^ static_cast<int>(op.in[l][1]);
          lanes[l].warp_out[0] = detail::bits_float(op.in[src & (detail::kWarp - 1)][0]);
        }
      });
  return f.warp_out[0];
}

void syncwarp(unsigned mask, const char* file, int line) {
  if (mask != 0xffffffffu) detail::abandon("the emulation supports full-warp __syncwarp only");
  const uint32_t in[1] = {0};
  detail::warp_collective("__syncwarp", file, line, in, 1, [](detail::WarpOp&, Fiber*) {});
}

void poll() {
  Block* b = detail::this_block;
  if (b == nullptr || b->running == nullptr) return;  // host code (a transport's host waits)
  b->waited_after_store |= b->stored_system;
  // Now and then a poll takes a while (seeded): a peer's store lands late.
  if (b->delays && b->rng.below(512) == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  detail::yield_thread(true);
}

void trap(const char* file, int line) {
  detail::abandon("__trap() at " + detail::site(file, line));
}

}  // namespace mhc_sp::emulation

extern "C" void mhc_sp_emulation_fiber_main() { mhc_sp::emulation::detail::fiber_main(); }
