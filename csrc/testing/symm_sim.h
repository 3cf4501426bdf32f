// SPDX-License-Identifier: Apache-2.0
#pragma once
// The single-GPU harness of the symm kernels (test-only): `world` simulated ranks on one device,
// each with its own buffer (plain device memory), workspace, counters and error record, and the
// pointer table of all of them; their calls run the production kernels' bodies for every rank in
// one cooperative launch (gridDim.y = ranks), or, for a world of one, the production launch. Built
// into the testing module for a GPU and into the emulated device's module (the same sources; the
// device's memory there is host memory, its tensors CPU tensors).

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "mhc_sp/comm.h"
#include "transport/symm/workspace.h"

namespace mhc_sp::testing {

using symm::RankView;
using symm::SymmWorkspace;

constexpr int kMaxSimRanks = 8;  // ranks one launch simulates
static_assert(kMaxSimRanks <= symm::kMaxRanks, "simulated ranks form one symm group");

class SymmSimGroup {
 public:
  SymmSimGroup(int64_t world, int64_t device, int64_t mailbox_slot_bytes, int64_t half_bytes,
               double timeout_s);
  int64_t world() const { return static_cast<int64_t>(ranks_.size()); }
  int64_t device() const { return device_; }
  // Where the device's memory lives as torch sees it (cuda:<device>; the emulated device: cpu):
  // every tensor of a call must be there.
  c10::Device memory() const { return memory_; }
  const SymmWorkspace& rank(int64_t r) const;

  // fused_layer on every rank: calls[r] is rank r's checked call (16-byte aligned), outs[r] its
  // outputs. absent >= 0: that rank never arrives. production: the production launch (a world of
  // one that always arrives).
  void fused_layer(const std::vector<LayerArgs>& calls, const std::vector<LayerOutputs>& outs,
                   int64_t absent, bool production, cudaStream_t stream) const;
  // A plain collective on every rank (same conventions); `lamport`: all_reduce through the mailbox.
  void collective(boundary::Op op, const std::vector<Tensor>& outs, const std::vector<Tensor>& ins,
                  int64_t num_tokens, bool lamport, int64_t absent, bool production,
                  cudaStream_t stream) const;

 private:
  std::vector<RankView> views() const;
  int64_t device_;
  c10::Device memory_{c10::kCPU};
  std::vector<c10::DataPtr> memory_blocks_;  // the buffers' memory, from the device's allocator
  std::vector<Tensor> buffers_;
  std::vector<std::unique_ptr<SymmWorkspace>> ranks_;
};

// The cooperative launches (testing/symm_sim.cu): every rank's parameters, rank `absent` (or -1)
// never arriving. hc_mult 4 only (V4's).
void sim_launch_fused_layer(const std::vector<RankView>& ranks, const std::vector<LayerArgs>& calls,
                            const std::vector<LayerOutputs>& outs, int absent, cudaStream_t stream);
void sim_launch_collective(const std::vector<RankView>& ranks, boundary::Op op,
                           const std::vector<Tensor>& outs, const std::vector<Tensor>& ins,
                           int64_t num_tokens, bool lamport, int absent, cudaStream_t stream);

}  // namespace mhc_sp::testing
