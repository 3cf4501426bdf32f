// SPDX-License-Identifier: Apache-2.0
#pragma once
// The emulated CUDA device (test-only, mhc_sp._emulated): what the device sources need from CUDA
// when they are compiled by the host C++ compiler and run on the CPU. The shim headers
// (csrc/emulation/shim/: cuda_runtime.h, cuda_bf16.h, c10/cuda/...) map CUDA's names onto this
// header; scheduler.cpp, memory.cpp, access_hooks.cpp, ptx.cpp and streams.cpp implement it.
// docs/emulation.md explains the model and its limits.
//
// Execution model. A kernel launch runs its blocks on OS threads, at most as many at once as the
// emulated device holds (SMs x blocks per SM, shared by every launch on that device), so a grid
// that relies on co-residency gets exactly what a GPU of that size would give it. The threads of
// a block are fibers on their block's OS thread, scheduled one at a time to their next
// synchronisation point (a barrier, a warp collective, a poll, a memory operation another device
// sees) in an order chosen from a seed: random, one warp as far ahead as it can go, one warp held
// back, or in order. A warp collective synchronises its 32 lanes only. A barrier or collective
// that not every thread reaches is reported as a deadlock naming the sites; two threads touching
// the same __shared__ bytes with no barrier between are reported as a race (racecheck).
//
// Memory. Device memory is host memory. The inline PTX of the device sources is executed by an
// interpreter of its text (ptx.cpp): every load, store, read-modify-write and fence is a C++
// atomic operation at the order the PTX names, its scope checked against the memory it touches
// (memory another device or the host uses needs .sys); CUDA's atomic intrinsics take the same
// path. Fresh device memory and every block's __shared__ memory are all-ones bytes (NaN).

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// CUDA's built-in variables. A block runs on one OS thread, so blockIdx, blockDim and gridDim are
// that thread's; threadIdx is the running fiber's, set by the block's scheduler at every switch.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

namespace mhc_sp::emulation {

// Synchronisation points of the running thread (file and line name the call site in reports).
void syncthreads(const char* file, int line);
int syncthreads_or(int predicate, const char* file, int line);
float shfl_xor(unsigned mask, float value, int lane_mask, const char* file, int line);
// __syncwarp: a warp collective without data (orders the warp's lanes, not the block's warps).
void syncwarp(unsigned mask, const char* file, int line);
// One poll of a spin-wait: the other threads of the block (and, now and then, other blocks on
// this core) run before the poll is repeated.
void poll();
[[noreturn]] void trap(const char* file, int line);

// ---- the memory model (memory.cpp) --------------------------------------------------------------

// PTX's memory orders (.weak is a plain access; .volatile is .relaxed.sys) and scopes.
enum class Sem : uint8_t { kWeak, kVolatile, kRelaxed, kAcquire, kRelease, kAcqRel, kSc };
enum class Scope : uint8_t { kNone, kCta, kGpu, kSys };
enum class Rmw : uint8_t { kAdd, kAddF32, kExch, kCas, kAnd, kOr, kXor, kMin, kMax, kInc, kDec };
struct Site {
  const char* file;
  int line;
  const char* what;  // the instruction's text, or the intrinsic's name
};
// bytes: 1, 2, 4 or 8; the value in the low bytes of the uint64_t. An atomic load is a poll first
// (poll_first: the other threads run; a vector's later elements skip it).
uint64_t mem_load(const void* p, int bytes, Sem sem, Scope scope, const Site& at,
                  bool poll_first = true);
void mem_store(void* p, int bytes, uint64_t v, Sem sem, Scope scope, const Site& at);
uint64_t mem_rmw(Rmw op, void* p, int bytes, uint64_t operand, uint64_t compare, Sem sem,
                 Scope scope, const Site& at);
void mem_fence(Sem sem, Scope scope, const Site& at);
// Memory that other devices or the host load and store too (a symm buffer every rank maps,
// host-mapped memory): accesses to it need .sys scope, and a poll of it must be atomic.
void add_system_memory(const void* p, size_t bytes, const std::string& name);
void remove_system_memory(const void* p);

// ---- inline PTX (ptx.cpp) -----------------------------------------------------------------------

// One operand of an asm statement: its constraint ("=r", "l", ...), where its value lives, and its
// size. The shim's MHC_SP_ASM passes the statement's operands in their order (%0, %1, ...).
struct AsmOperand {
  const char* constraint;
  void* value;
  int bytes;
};
template <typename T>
AsmOperand asm_operand(const char* constraint, T& value) {
  return {constraint, static_cast<void*>(&value), static_cast<int>(sizeof(T))};
}
template <typename T>
AsmOperand asm_operand(const char* constraint, const T& value) {
  return {constraint, const_cast<void*>(static_cast<const void*>(&value)),
          static_cast<int>(sizeof(T))};
}
// Executes the PTX `text` (one or more instructions) with these operands, as the GPU would.
void run_ptx(const char* text, const char* file, int line,
             std::initializer_list<AsmOperand> outputs, std::initializer_list<AsmOperand> inputs);

// ---- devices and launches (streams.cpp) ---------------------------------------------------------

// How the threads of a block are scheduled between their synchronisation points. kMixed: each
// block of each launch draws one of the others from the seed.
enum class Schedule : uint8_t { kMixed, kRandom, kWarpAhead, kWarpBehind, kInOrder };
const char* schedule_name(Schedule s);
Schedule schedule_named(const std::string& name);

// The emulated device a launch runs on: SMs, resident blocks per SM (what the occupancy
// calculator reports for every kernel), the seed of the schedules and delays, the schedule, the
// racecheck, and how long a launch may run.
struct DeviceConfig {
  int sms = 4;
  int blocks_per_sm = 2;
  uint64_t seed = 1;
  double launch_timeout_s = 120;  // a launch still running after this is stopped and reported
  Schedule schedule = Schedule::kMixed;
  bool racecheck = true;
  // Random delays (seeded): at stores to system memory, at polls, at the start of a World's calls.
  bool delays = true;
};
void configure(const DeviceConfig& c);  // every device; no launch may run meanwhile
DeviceConfig config();
// One device of another size (after configure(), which resets every device): a rank whose GPU
// differs from its peers' (MIG, MPS shares, mixed SKUs). lag_us > 0 makes it a lagging rank: each
// of its blocks, at the first block barrier after it stored to system memory (an arrival, a
// Lamport push) and then polled for its peers, stalls that long before it goes on, as a rank
// descheduled right after it arrived. Its peers are through meanwhile and go on into their next
// call while it still has this call's rows to read and its mailbox to re-arm.
void configure_device(int device, int sms, int blocks_per_sm, int lag_us = 0);
int device_sms(int device);
int device_blocks_per_sm(int device);
int device_count();

// A kernel launch on the device's stream: `body` is run by every thread of every block.
// cooperative: every block resident at once or the launch fails; dependent: a programmatic
// dependent of the stream's previous kernel. Returns the empty string once the launch is on its
// way (a launch runs to completion before the host continues, except a kernel whose blocks all
// execute griddepcontrol.launch_dependents: the host may then launch its dependent), else why it
// cannot be launched. What goes wrong while it runs (a deadlock, a race, a trap, the timeout) is
// the stream's error (synchronize()).
std::string launch(int device, dim3 grid, dim3 block, bool cooperative, bool dependent,
                   std::function<void()> body);
// Waits for everything on the device's stream; returns the first error since the last call.
std::string synchronize(int device);

// Counts of what the emulation ran since the last reset (tests check that a case took the path
// it meant to: its kernels, its grids, and how the ranks' launches overlapped).
struct LaunchRecord {
  unsigned grid_x, grid_y, block_x;
  bool cooperative, dependent;
  int device;
  uint64_t start_ns, end_ns;
};
std::vector<LaunchRecord> launches();
void reset_launches();

// The event operations on the emulated streams since the last reset (the order of the symm calls
// on a device is made of them): which device, "wait" or "record", which event (an id per event).
struct EventRecord {
  int device;
  const char* what;
  uint64_t event;
};
std::vector<EventRecord> events();
void reset_events();

// Stream capture (a CUDA graph): between begin_capture and end_capture the device's stream
// records what it is given instead of running it; replay runs the recording again.
struct Graph;
void begin_capture(int device);
std::shared_ptr<Graph> end_capture(int device);
void replay(const std::shared_ptr<Graph>& graph);

// The seeded draws of the host side (delays at the start of a call).
uint64_t host_draw(uint64_t salt);

}  // namespace mhc_sp::emulation
