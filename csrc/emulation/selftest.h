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

}  // namespace mhc_sp::emulation
