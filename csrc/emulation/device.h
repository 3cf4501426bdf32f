// SPDX-License-Identifier: Apache-2.0
#pragma once
// The emulated CUDA device (test-only, mhc_sp._emulated): what the device sources need from CUDA
// when they are compiled by the host C++ compiler (MHC_SP_EMULATION) and run on the CPU. The shim
// headers (csrc/emulation/shim/: cuda_runtime.h, cuda_bf16.h, c10/cuda/...) map CUDA's names onto
// this header; runtime.cpp implements it. docs/emulation.md explains the model and its limits.
//
// Execution model. A kernel launch runs its blocks on OS threads, at most as many at once as the
// emulated device holds (SMs x blocks per SM, shared by every launch on that device), so a grid
// that relies on co-residency gets exactly what a GPU of that size would give it. The threads of
// a block are fibers on their block's OS thread: each runs until its next synchronisation point
// (__syncthreads, a warp collective, a poll of a spin-wait, its end), then the next one runs, in
// an order that alternates between passes; so a missing barrier shows as a wrong value, and a
// barrier or warp collective that not every thread reaches is reported as a deadlock naming the
// sites, instead of hanging. __shared__ variables are thread_local: one copy per block.
//
// Memory. Device memory is host memory. The PTX wrappers map onto C++ atomics with the same
// orders (ld.acquire -> acquire load, st.release -> release store, .relaxed -> relaxed, fence.sc /
// fence.acq_rel -> std::atomic_thread_fence); 16-byte relaxed vectors are four 32-bit relaxed
// accesses (PTX promises no more). Device-scope atomics (atomicAdd, atomicCAS) are relaxed, as in
// CUDA, except under ThreadSanitizer, which ignores standalone fences: there they are acq_rel, so
// that the fence + atomic patterns (last block done, call counters) read as the synchronisation
// they are.

#include <cstdint>
#include <cstring>
#include <functional>
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
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with accumulator c in every element: the
// warp's fragments are gathered as the PTX ISA lays them out (lane / 4 = group, lane % 4 = index
// in the group), and each output is its row of A times its column of B (16 exact products of bf16
// values, summed in double, rounded once to fp32) plus c.
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float c,
                       const char* file, int line);
// One poll of a spin-wait: the other threads of the block (and, now and then, other blocks on
// this core) run before the poll is repeated.
void poll();
[[noreturn]] void trap(const char* file, int line);
uint64_t global_timer_ns();

// The emulated device a launch runs on: SMs, resident blocks per SM (what the occupancy
// calculator reports for every kernel), and the seed of the threads' order in a block.
struct DeviceConfig {
  int sms = 4;
  int blocks_per_sm = 2;
  uint64_t seed = 1;
  double launch_timeout_s = 120;  // a launch still running after this is stopped and reported
};
void configure(const DeviceConfig& c);  // every device; no launch may run meanwhile
DeviceConfig config();
// One device of another size (after configure(), which resets every device): a rank whose GPU
// differs from its peers' (MIG, MPS shares, mixed SKUs).
void configure_device(int device, int sms, int blocks_per_sm);
int device_sms(int device);
int device_blocks_per_sm(int device);
int device_count();

// A kernel launch: `body` is run by every thread of every block. `device`: which emulated device
// (its resident-block slots); cooperative: every block resident at once or the launch fails.
// Returns the empty string on success, else what went wrong (a deadlock in a block, a trap, the
// launch timeout, a cooperative grid that does not fit).
std::string launch(int device, dim3 grid, dim3 block, bool cooperative,
                   const std::function<void()>& body);

// Counts of what the emulation ran since the last reset (tests check that a case took the path
// it meant to: its kernels, its grids).
struct LaunchRecord {
  unsigned grid_x, grid_y, block_x;
  bool cooperative;
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

}  // namespace mhc_sp::emulation
