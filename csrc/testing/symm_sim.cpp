// SPDX-License-Identifier: Apache-2.0
// The simulated ranks of the symm harness (testing/symm_sim.h).

#include "testing/symm_sim.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include "transport/symm/kernels.h"

namespace mhc_sp::testing {

SymmSimGroup::SymmSimGroup(int64_t world, int64_t device, int64_t mailbox_slot_bytes,
                           int64_t half_bytes, double timeout_s)
    : device_(device) {
  TORCH_CHECK_VALUE(world >= 1 && world <= kMaxSimRanks, "world: the harness simulates 1 to ",
                    kMaxSimRanks, " ranks, got ", world);
  const int64_t devices = c10::cuda::device_count();
  TORCH_CHECK_VALUE(device >= 0 && device < devices, "device: expected a device index in [0, ",
                    devices, "), got ", device);
  // The device's memory, events and streams.
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const symm::BufferLayout L = symm::buffer_layout(world, mailbox_slot_bytes, half_bytes);
  std::vector<int64_t> ptrs;
  for (int64_t r = 0; r < world; ++r) {
    // From the device's allocator, as the kernels' split-K workspaces are
    // (transport/symm/kernel_params.cuh), so that the emulated device runs this unchanged.
    memory_blocks_.push_back(
        c10::cuda::CUDACachingAllocator::get()->allocate(static_cast<size_t>(L.total_bytes)));
    memory_ = memory_blocks_.back().device();
    buffers_.push_back(at::from_blob(memory_blocks_.back().get(), {L.total_bytes},
                                     at::TensorOptions().dtype(at::kByte).device(memory_)));
    ptrs.push_back(reinterpret_cast<int64_t>(buffers_.back().data_ptr()));
  }
  for (int64_t r = 0; r < world; ++r) {
    ranks_.push_back(std::make_unique<SymmWorkspace>(buffers_[r], ptrs, r, world,
                                                     mailbox_slot_bytes, half_bytes, timeout_s));
  }
}

const SymmWorkspace& SymmSimGroup::rank(int64_t r) const {
  TORCH_CHECK_VALUE(r >= 0 && r < world(), "rank: expected a value in [0, ", world(), "), got ", r);
  return *ranks_[r];
}

std::vector<RankView> SymmSimGroup::views() const {
  std::vector<RankView> out;
  for (const auto& r : ranks_) out.push_back(r->view());
  return out;
}

void SymmSimGroup::fused_layer(const std::vector<LayerArgs>& calls,
                               const std::vector<LayerOutputs>& outs, int64_t absent,
                               bool production, cudaStream_t stream) const {
  const symm::CallOrder::Turn turn = ranks_[0]->turn(stream);  // the ranks share the device
  if (production) {
    symm::launch_fused_layer(ranks_[0]->view(), calls[0], outs[0], stream);
  } else {
    sim_launch_fused_layer(views(), calls, outs, static_cast<int>(absent), stream);
  }
}

void SymmSimGroup::collective(boundary::Op op, const std::vector<Tensor>& outs,
                              const std::vector<Tensor>& ins, int64_t num_tokens, bool lamport,
                              int64_t absent, bool production, cudaStream_t stream) const {
  const symm::CallOrder::Turn turn = ranks_[0]->turn(stream);
  if (production) {
    symm::launch_collective(ranks_[0]->view(), op, outs[0], ins[0], num_tokens, lamport, stream);
  } else {
    sim_launch_collective(views(), op, outs, ins, num_tokens, lamport, static_cast<int>(absent),
                          stream);
  }
}

}  // namespace mhc_sp::testing
