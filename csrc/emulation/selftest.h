// SPDX-License-Identifier: Apache-2.0
#pragma once
// Checks of the emulated device itself (emulation/selftest.cpp).

#include <ATen/ATen.h>

namespace mhc_sp::emulation {

// out[lane] = __shfl_xor_sync(all, lane, lane_mask) over one warp.
at::Tensor selftest_shfl(int64_t lane_mask);
// out[t] = what thread t reads of thread t + 1's shared-memory value, with or without a barrier.
at::Tensor selftest_neighbours(int64_t threads, bool barrier);
// Kernels the emulation must refuse (RuntimeError naming the sites): two different barriers;
// half a warp at a shuffle.
void selftest_divergent_barrier();
void selftest_partial_warp();
// D = A (16, 16) @ B (16, 8) through the emulated mma.sync, fragments laid out as the ISA says.
at::Tensor selftest_mma(const at::Tensor& a, const at::Tensor& b);
// A chain of `blocks` blocks, each waiting for its neighbour's flag.
void selftest_chain(int64_t blocks, bool wait_for_later, bool cooperative);
// Warp 0 writes shared memory, warp 1 reads it after a shuffle (and a barrier or not): a race
// without the barrier. out[lane] = lane + 1 when ordered.
at::Tensor selftest_cross_warp(bool barrier);
// Lanes of one warp swap values through shared memory across a shuffle: ordered, no race.
at::Tensor selftest_same_warp();
// What a never-written __shared__ flag holds at the start of each of `blocks` blocks.
at::Tensor selftest_fresh_flag(int64_t blocks);
// A spin-wait on host-mapped memory through a relaxed .sys load, or a weak one (reported).
void selftest_poll(bool weak);
// A .gpu-scoped relaxed store to host-mapped memory (reported) or to device memory (fine).
void selftest_gpu_scope_store(bool host_mapped);
// PTX the interpreter does not run (refused, naming it).
void selftest_unknown_ptx();
// A primary grid that triggers its dependent before writing out[i] = i + 1, and a dependent that
// copies it after griddepcontrol.wait, or without waiting.
at::Tensor selftest_pdl(int64_t n, bool wait);

}  // namespace mhc_sp::emulation
