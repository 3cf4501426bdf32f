// SPDX-License-Identifier: Apache-2.0
// The emulated CUDA device (csrc/emulation/device.h): blocks on OS threads within the device's
// resident-block slots, the threads of a block as fibers scheduled at every synchronisation point,
// warp collectives over 32 lanes, and the runtime API subset of the shim (shim/cuda_runtime.h).

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "c10/cuda/CUDACachingAllocator.h"
#include "c10/cuda/CUDAStream.h"
#include "cuda_runtime.h"

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

struct CUstream_st {
  int device;
};

struct CUevent_st {
  uint64_t id;
};

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace mhc_sp::emulation {

namespace {

constexpr int kMaxDevices = 16;
constexpr int kWarp = 32;
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kFiberStack = size_t(1) << 20;  // ASan's redzones need room
#else
constexpr size_t kFiberStack = size_t(256) << 10;
#endif

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// ---- devices: configuration and resident-block slots --------------------------------------------

struct Device {
  std::mutex m;
  std::condition_variable cv;
  int sms = 0, blocks_per_sm = 0;  // this device's size (configure, configure_device)
  int free_slots = 0;
  int running_launches = 0;
};

std::mutex config_mutex;
DeviceConfig device_config;
Device devices[kMaxDevices];
CUstream_st streams[kMaxDevices];
std::mutex launches_mutex;
std::vector<LaunchRecord> launch_log;
std::vector<EventRecord> event_log;
std::atomic<uint64_t> next_event{1};

void log_event(cudaStream_t stream, const char* what, cudaEvent_t e);

struct DeviceInit {
  DeviceInit() {
    for (int d = 0; d < kMaxDevices; ++d) {
      streams[d].device = d;
      devices[d].sms = device_config.sms;
      devices[d].blocks_per_sm = device_config.blocks_per_sm;
      devices[d].free_slots = device_config.sms * device_config.blocks_per_sm;
    }
  }
} device_init;

thread_local int host_device = 0;  // the calling host thread's current device
thread_local std::string last_error;

int capacity(const Device& d) { return d.sms * d.blocks_per_sm; }

void acquire_slots(Device& d, int n) {
  std::unique_lock<std::mutex> lock(d.m);
  d.cv.wait(lock, [&] { return d.free_slots >= n; });
  d.free_slots -= n;
}

void release_slots(Device& d, int n) {
  {
    const std::lock_guard<std::mutex> lock(d.m);
    d.free_slots += n;
  }
  d.cv.notify_all();
}

// ---- stack switching
// ------------------------------------------------------------------------------ On x86-64 a switch
// saves the callee-saved registers on the old stack and moves to the new one (what a function call
// must preserve: the kernels' fibers switch only inside calls); elsewhere ucontext, whose
// swapcontext also saves the signal mask with a system call on every switch.

#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};

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
struct Context {
  ucontext_t uc;
};

void switch_context(Context& from, const Context& to) { swapcontext(&from.uc, &to.uc); }

void make_context(Context& c, void* stack, size_t size) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, mhc_sp_emulation_fiber_main, 0);
}
#endif

// ---- fibers
// ---------------------------------------------------------------------------------------

enum class Wait { kReady, kBarrier, kWarp, kDone, kAbandoned };

struct Fiber {
  Context ctx;
  uint3 thread_idx;
  Wait wait = Wait::kReady;
  const char* file = nullptr;  // where it waits
  int line = 0;
  bool polled = false;
  int barrier_result = 0;
  float warp_out[4] = {};
  void* stack = nullptr;  // kFiberStack bytes above a guard page
  void* tsan_fiber = nullptr;
  void* asan_fake_stack = nullptr;
};

struct WarpOp {
  int arrived = 0;
  const char* name = nullptr;
  const char* file = nullptr;
  int line = 0;
  uint32_t in[kWarp][8] = {};
};

struct LaunchState;

struct Block {
  uint3 block_idx;
  LaunchState* launch = nullptr;
  std::vector<Fiber>* fibers = nullptr;
  int threads = 0, live = 0;
  Context scheduler;
  Fiber* running = nullptr;
  int bar_arrived = 0, bar_or = 0, bar_line = 0;
  const char* bar_file = nullptr;
  std::vector<WarpOp> warps;
  bool failed = false;
  const void* scheduler_stack = nullptr;  // ASan: the OS thread's own stack
  size_t scheduler_stack_size = 0;
  void* scheduler_tsan_fiber = nullptr;
  void* scheduler_fake_stack = nullptr;
};

struct LaunchState {
  const std::function<void()>* body;
  dim3 grid, block;
  std::atomic<bool> aborted{false};
  std::mutex m;
  std::string failure;
  std::atomic<uint64_t> next{0};
  uint64_t deadline_ns = 0;
  uint64_t seed = 0;
};

thread_local Block* this_block_state = nullptr;

void fail(Block& b, const std::string& what) {
  b.failed = true;
  LaunchState& L = *b.launch;
  const std::lock_guard<std::mutex> lock(L.m);
  if (L.failure.empty()) {
    std::ostringstream s;
    s << "block (" << b.block_idx.x << ", " << b.block_idx.y << ") of a grid of (" << L.grid.x
      << ", " << L.grid.y << ") x " << L.block.x << " threads: " << what;
    L.failure = s.str();
  }
  L.aborted = true;
}

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
  Block& b = *this_block_state;
  before_switch(dying ? nullptr : &f.asan_fake_stack, b.scheduler_stack, b.scheduler_stack_size,
                b.scheduler_tsan_fiber);
  switch_context(f.ctx, b.scheduler);
  after_switch(f.asan_fake_stack, &b.scheduler_stack, &b.scheduler_stack_size);
}

// The running fiber stops for good (a failed check): the block's scheduler ends the launch.
[[noreturn]] void abandon(Fiber& f, const std::string& what) {
  fail(*this_block_state, what);
  f.wait = Wait::kAbandoned;
  to_scheduler(f);
  std::abort();  // never resumed
}

// The first code a fiber runs (mhc_sp_emulation_fiber_main below enters here).
void fiber_main() {
  Block& b = *this_block_state;
  Fiber& f = *b.running;
  after_switch(nullptr, &b.scheduler_stack, &b.scheduler_stack_size);
  (*b.launch->body)();
  f.wait = Wait::kDone;
  --b.live;
  if (b.bar_arrived > 0 && b.bar_arrived == b.live) {  // exited threads no longer hold a barrier
    for (Fiber& o : *b.fibers) {
      if (o.wait == Wait::kBarrier) {
        o.wait = Wait::kReady;
        o.barrier_result = b.bar_or;
      }
    }
    b.bar_arrived = 0;
  }
  to_scheduler(f, true);
  std::abort();  // a finished fiber is never resumed
}

void run_fiber(Block& b, Fiber& f) {
  b.running = &f;
  threadIdx = f.thread_idx;
  before_switch(&b.scheduler_fake_stack, f.stack, kFiberStack, f.tsan_fiber);
  switch_context(b.scheduler, f.ctx);
  after_switch(b.scheduler_fake_stack, nullptr, nullptr);
}

std::string site(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
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

void run_block(LaunchState& L, FiberPool& pool, uint64_t index) {
  Block b;
  b.block_idx =
      uint3{static_cast<unsigned>(index % L.grid.x), static_cast<unsigned>(index / L.grid.x), 0};
  blockIdx = b.block_idx;
  blockDim = L.block;
  gridDim = L.grid;
  b.launch = &L;
  b.threads = static_cast<int>(L.block.x);
  b.live = b.threads;
  b.warps.resize((b.threads + kWarp - 1) / kWarp);
  pool.reserve(b.threads);
  b.fibers = &pool.fibers;
  this_block_state = &b;
#if defined(__SANITIZE_THREAD__)
  b.scheduler_tsan_fiber = __tsan_get_current_fiber();
#endif
  for (int t = 0; t < b.threads; ++t) {
    Fiber& f = pool.fibers[t];
    f.thread_idx = uint3{static_cast<unsigned>(t), 0, 0};
    f.wait = Wait::kReady;
    f.asan_fake_stack = nullptr;
#if defined(__SANITIZE_ADDRESS__)
    __asan_unpoison_memory_region(f.stack, kFiberStack);  // frames an abandoned fiber left
#endif
#if defined(__SANITIZE_THREAD__)
    f.tsan_fiber = __tsan_create_fiber(0);
#endif
    make_context(f.ctx, f.stack, kFiberStack);
  }
  // Passes over the ready threads, alternating direction and rotating the start, so that neither
  // order hides a missing barrier.
  uint64_t rng = L.seed ^ (index * 0x9e3779b97f4a7c15ull);
  int idle = 0;
  for (uint64_t pass = 0; b.live > 0 && !b.failed; ++pass) {
    if (L.aborted) break;  // another block failed, or the launch timed out
    if (now_ns() > L.deadline_ns) {
      fail(b, "the launch ran past the emulation's launch timeout (a wait that never ends?)");
      break;
    }
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    const int start = static_cast<int>(rng % static_cast<uint64_t>(b.threads));
    const bool reverse = (pass & 1) != 0;
    bool ran = false, progress = false;
    for (int k = 0; k < b.threads && !b.failed; ++k) {
      const int t = (start + (reverse ? b.threads - 1 - k : k)) % b.threads;
      Fiber& f = pool.fibers[t];
      if (f.wait != Wait::kReady) continue;
      f.polled = false;
      run_fiber(b, f);
      ran = true;
      progress |= !f.polled;
    }
    if (b.failed || b.live == 0) break;
    if (!ran) {
      fail(b, deadlock_report(b));
      break;
    }
    if (progress) {
      idle = 0;
    } else if (++idle < 64) {
      std::this_thread::yield();  // every thread polls: let the blocks it waits for run
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
#if defined(__SANITIZE_THREAD__)
  for (int t = 0; t < b.threads; ++t) __tsan_destroy_fiber(pool.fibers[t].tsan_fiber);
#endif
  this_block_state = nullptr;
}

// ---- warp collectives
// -----------------------------------------------------------------------------

// Lane `lane` of the running thread's warp arrives at collective `name` with `words` inputs; when
// the 32nd lane arrives, finish(op) computes every lane's result (into their fibers' warp_out).
template <class Finish>
void warp_collective(const char* name, const char* file, int line, const uint32_t* in, int words,
                     Finish&& finish) {
  Block& b = *this_block_state;
  Fiber& f = *b.running;
  const int t = static_cast<int>(f.thread_idx.x);
  WarpOp& op = b.warps[t / kWarp];
  if (op.arrived == 0) {
    op.name = name;
    op.file = file;
    op.line = line;
  } else if (op.line != line || std::strcmp(op.file, file) != 0 || op.name != name) {
    abandon(f, std::string("lanes of warp ") + std::to_string(t / kWarp) + " diverge: " + op.name +
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
    for (int l = 0; l < kWarp; ++l) lanes[l].wait = Wait::kReady;
    op.arrived = 0;
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

// ---- synchronisation points
// -----------------------------------------------------------------------

int syncthreads_or(int predicate, const char* file, int line) {
  Block& b = *this_block_state;
  Fiber& f = *b.running;
  if (b.bar_arrived == 0) {
    b.bar_file = file;
    b.bar_line = line;
    b.bar_or = 0;
  } else if (b.bar_line != line || std::strcmp(b.bar_file, file) != 0) {
    abandon(f, "threads reach different barriers: __syncthreads at " +
                   site(b.bar_file, b.bar_line) + " and at " + site(file, line) +
                   " (a barrier in divergent code)");
  }
  b.bar_or |= predicate;
  ++b.bar_arrived;
  f.wait = Wait::kBarrier;
  f.file = file;
  f.line = line;
  if (b.bar_arrived == b.live) {
    for (Fiber& o : *b.fibers) {
      if (o.wait == Wait::kBarrier) {
        o.wait = Wait::kReady;
        o.barrier_result = b.bar_or;
      }
    }
    b.bar_arrived = 0;
  }
  to_scheduler(f);
  return f.barrier_result;
}

void syncthreads(const char* file, int line) { syncthreads_or(0, file, line); }

float shfl_xor(unsigned mask, float value, int lane_mask, const char* file, int line) {
  Fiber& f = *this_block_state->running;
  if (mask != 0xffffffffu) abandon(f, "the emulation supports full-warp shuffles only");
  const uint32_t in[2] = {float_bits(value), static_cast<uint32_t>(lane_mask)};
  warp_collective("__shfl_xor_sync", file, line, in, 2, [](WarpOp& op, Fiber* lanes) {
    for (int l = 0; l < kWarp; ++l) {
      const int src = l ^ static_cast<int>(op.in[l][1]);
      lanes[l].warp_out[0] = bits_float(op.in[src & (kWarp - 1)][0]);
    }
  });
  return f.warp_out[0];
}

void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float c,
                       const char* file, int line) {
  Fiber& f = *this_block_state->running;
  const uint32_t in[7] = {a[0], a[1], a[2], a[3], b0, b1, float_bits(c)};
  warp_collective("mma.m16n8k16", file, line, in, 7, [](WarpOp& op, Fiber* lanes) {
    // The fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"):
    // lane = 4 * group + index; A's registers hold (row group | group + 8, columns 2 index (+1),
    // +8 for the last two registers); B's hold (rows 2 index (+1), +8 for the second; column
    // group).
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
      const float acc = bits_float(op.in[lane][6]);
      const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * i, 2 * i + 1, 2 * i, 2 * i + 1};
      for (int e = 0; e < 4; ++e) {
        double s = 0;  // bf16 x bf16 products are exact; 16 of them in double, rounded once
        for (int k = 0; k < 16; ++k) s += double(A[rows[e]][k]) * double(B[k][cols[e]]);
        lanes[lane].warp_out[e] = static_cast<float>(s + double(acc));
      }
    }
  });
  for (int e = 0; e < 4; ++e) d[e] = f.warp_out[e];
}

void poll() {
  Block* b = this_block_state;
  if (b == nullptr || b->running == nullptr) return;  // host code (the shm transport's waits)
  b->running->polled = true;
  to_scheduler(*b->running);
}

void trap(const char* file, int line) {
  abandon(*this_block_state->running, "__trap() at " + site(file, line));
}

uint64_t global_timer_ns() {
  poll();  // the waits read the timer between polls
  return now_ns();
}

// ---- launches
// -------------------------------------------------------------------------------------

void configure(const DeviceConfig& c) {
  TORCH_CHECK_VALUE(c.sms >= 1 && c.sms <= 1024, "sms: expected a value in [1, 1024], got ", c.sms);
  TORCH_CHECK_VALUE(c.blocks_per_sm >= 1 && c.blocks_per_sm <= 32,
                    "blocks_per_sm: expected a value in [1, 32], got ", c.blocks_per_sm);
  TORCH_CHECK_VALUE(c.launch_timeout_s > 0, "launch_timeout_s: expected a positive value, got ",
                    c.launch_timeout_s);
  const std::lock_guard<std::mutex> lock(config_mutex);
  for (Device& d : devices) {
    const std::lock_guard<std::mutex> dl(d.m);
    TORCH_CHECK(d.running_launches == 0, "emulation: configure() while a kernel runs");
    d.sms = c.sms;
    d.blocks_per_sm = c.blocks_per_sm;
    d.free_slots = capacity(d);
  }
  device_config = c;
}

void configure_device(int device, int sms, int blocks_per_sm) {
  TORCH_CHECK_VALUE(device >= 0 && device < kMaxDevices, "device: expected [0, ", kMaxDevices,
                    "), got ", device);
  TORCH_CHECK_VALUE(sms >= 1 && sms <= 1024, "sms: expected a value in [1, 1024], got ", sms);
  TORCH_CHECK_VALUE(blocks_per_sm >= 1 && blocks_per_sm <= 32,
                    "blocks_per_sm: expected a value in [1, 32], got ", blocks_per_sm);
  Device& d = devices[device];
  const std::lock_guard<std::mutex> dl(d.m);
  TORCH_CHECK(d.running_launches == 0, "emulation: configure_device() while a kernel runs");
  d.sms = sms;
  d.blocks_per_sm = blocks_per_sm;
  d.free_slots = capacity(d);
}

int device_sms(int device) {
  const std::lock_guard<std::mutex> dl(devices[device].m);
  return devices[device].sms;
}

int device_blocks_per_sm(int device) {
  const std::lock_guard<std::mutex> dl(devices[device].m);
  return devices[device].blocks_per_sm;
}

DeviceConfig config() {
  const std::lock_guard<std::mutex> lock(config_mutex);
  return device_config;
}

int device_count() { return kMaxDevices; }

std::string launch(int device, dim3 grid, dim3 block, bool cooperative,
                   const std::function<void()>& body) {
  if (device < 0 || device >= kMaxDevices) return "no emulated device " + std::to_string(device);
  if (block.y != 1 || block.z != 1 || grid.z != 1) return "only 1-D blocks and 2-D grids";
  if (block.x < kWarp || block.x > 1024 || block.x % kWarp != 0) {
    return "block size " + std::to_string(block.x) + ": expected a multiple of 32 up to 1024";
  }
  const DeviceConfig c = config();
  Device& d = devices[device];
  const int slots = [&] {
    const std::lock_guard<std::mutex> lock(d.m);
    ++d.running_launches;
    return capacity(d);
  }();
  const uint64_t total = uint64_t(grid.x) * grid.y;
  {
    const std::lock_guard<std::mutex> lock(launches_mutex);
    launch_log.push_back(LaunchRecord{grid.x, grid.y, block.x, cooperative});
  }
  auto finished = [&](std::string failure) {
    const std::lock_guard<std::mutex> lock(d.m);
    --d.running_launches;
    return failure;
  };
  if (total == 0) return finished("");
  if (cooperative && total > uint64_t(slots)) {
    return finished("a cooperative launch of " + std::to_string(total) +
                    " blocks does not fit the " + std::to_string(slots) +
                    " resident blocks of device " + std::to_string(device));
  }
  LaunchState L;
  L.body = &body;
  L.grid = grid;
  L.block = block;
  L.deadline_ns = now_ns() + static_cast<uint64_t>(c.launch_timeout_s * 1e9);
  L.seed = c.seed;
  const int workers = static_cast<int>(std::min<uint64_t>(total, uint64_t(slots)));
  if (cooperative) acquire_slots(d, static_cast<int>(total));
  auto work = [&] {
    FiberPool pool;
    for (;;) {
      const uint64_t index = L.next.fetch_add(1);
      if (index >= total) break;
      if (!cooperative) acquire_slots(d, 1);
      if (!L.aborted) run_block(L, pool, index);
      if (!cooperative) release_slots(d, 1);
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (int w = 0; w < workers; ++w) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  if (cooperative) release_slots(d, static_cast<int>(total));
  return finished(L.failure);
}

std::vector<LaunchRecord> launches() {
  const std::lock_guard<std::mutex> lock(launches_mutex);
  return launch_log;
}

void reset_launches() {
  const std::lock_guard<std::mutex> lock(launches_mutex);
  launch_log.clear();
}

std::vector<EventRecord> events() {
  const std::lock_guard<std::mutex> lock(launches_mutex);
  return event_log;
}

void reset_events() {
  const std::lock_guard<std::mutex> lock(launches_mutex);
  event_log.clear();
}

namespace {
void log_event(cudaStream_t stream, const char* what, cudaEvent_t e) {
  const std::lock_guard<std::mutex> lock(launches_mutex);
  event_log.push_back(EventRecord{stream_device(stream), what, e->id});
}
}  // namespace

int stream_device(cudaStream_t stream) { return stream != nullptr ? stream->device : host_device; }

cudaStream_t device_stream(int device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "emulation: no device ", device);
  return &streams[device];
}

cudaError_t record_launch_error(const std::string& what) {
  last_error = what;
  return cudaErrorLaunchFailure;
}

}  // namespace mhc_sp::emulation

extern "C" void mhc_sp_emulation_fiber_main() { mhc_sp::emulation::fiber_main(); }

// ---- the runtime API subset ---------------------------------------------------------------------

using mhc_sp::emulation::host_device;
using mhc_sp::emulation::kMaxDevices;
using mhc_sp::emulation::last_error;

cudaError_t cudaGetDevice(int* device) {
  *device = host_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidValue;
  host_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (attr != cudaDevAttrMultiProcessorCount || device < 0 || device >= kMaxDevices) {
    return cudaErrorInvalidValue;
  }
  *value = mhc_sp::emulation::device_sms(device);
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return cudaSuccess; }  // launches report their own errors

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorLaunchFailure: return last_error.c_str();
    default: return "unknown error";
  }
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  if (bytes > 0 && p == nullptr) return cudaErrorInvalidValue;
  if (bytes > 0) std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  *p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  return *p == nullptr ? cudaErrorInvalidValue : cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned) {
  *device = host;  // host-mapped memory: the same address on the emulated device
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

// Streams are synchronous: every event is complete when it is recorded, every wait is satisfied.
// The waits and records are logged (events()).
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = new CUevent_st{mhc_sp::emulation::next_event++};
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  return cudaEventRecordWithFlags(e, stream, cudaEventRecordDefault);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t stream, unsigned) {
  if (e == nullptr) return cudaErrorInvalidValue;
  mhc_sp::emulation::log_event(stream, "record", e);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned) {
  if (e == nullptr) return cudaErrorInvalidValue;
  mhc_sp::emulation::log_event(stream, "wait", e);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  *status = cudaStreamCaptureStatusNone;  // the emulation has no graph capture
  return cudaSuccess;
}

// ---- the device allocator -----------------------------------------------------------------------

namespace c10::cuda::CUDACachingAllocator {
namespace {

void free_device_memory(void* p) { std::free(p); }

class EmulatedDeviceAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    const size_t size = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, size);
    TORCH_CHECK(p != nullptr, "emulation: out of memory allocating ", bytes, " bytes");
    std::memset(p, 0xff, size);
    return {p, p, &free_device_memory, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_device_memory; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

}  // namespace

c10::Allocator* get() {
  static EmulatedDeviceAllocator allocator;
  return &allocator;
}

}  // namespace c10::cuda::CUDACachingAllocator
