// SPDX-License-Identifier: Apache-2.0
#pragma once
// The symm transport's host objects (csrc/cuda/symm_comm.cpp): a rank's workspace, the
// communicator the ops use, and the single-GPU harness's group of simulated ranks.

#include <ATen/ATen.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mhc_sp/comm.h"
#include "mhc_sp/cuda/symm_launch.h"
#include "mhc_sp/scalars.h"
#include "mhc_sp/symm.h"

namespace mhc_sp::symm {

using at::Tensor;

// fused_layer's tensor arguments on one rank, already checked by the op (norm_weight fp32).
struct LayerTensors {
  Tensor partial, residual, post, comb, fn, hc_scale, hc_base;
  std::optional<Tensor> norm_weight;
};

// One rank's state: its buffer (every peer maps it), the pointer table, device-local counters and
// epochs, and a host-mapped error record the kernels fill when a wait fails.
class SymmWorkspace {
 public:
  // Initialises this rank's own buffer (flags, armed mailboxes, header) and synchronises its
  // stream; the caller must then make every rank of the group pass a host barrier before any
  // kernel runs.
  SymmWorkspace(Tensor buffer, const std::vector<int64_t>& peer_ptrs, int64_t rank, int64_t world,
                int64_t mailbox_slot_bytes, int64_t half_bytes, double timeout_s);
  ~SymmWorkspace();
  SymmWorkspace(const SymmWorkspace&) = delete;
  SymmWorkspace& operator=(const SymmWorkspace&) = delete;

  RankHandles handles(bool absent) const;
  // Orders a call on `stream` after this workspace's previous call (StreamChain: a wait on the
  // previous call's event when the stream changed); call_enqueued records the call's own event
  // once its kernels are enqueued. Bookkeeping of call order only, hence const.
  void order_call(cudaStream_t stream) const;
  void call_enqueued(cudaStream_t stream) const;
  int64_t rank() const { return rank_; }
  int64_t world() const { return world_; }
  const BufferLayout& layout() const { return layout_; }
  // What the kernels recorded (code 0: nothing failed). A host read, no device sync.
  ErrorRecord error() const;
  // Raises (RuntimeError naming the peer) when a wait has failed on this workspace.
  void check(const std::string& group) const;
  double timeout_s() const { return timeout_s_; }

 private:
  Tensor buffer_, peers_, state_;
  int64_t rank_, world_;
  BufferLayout layout_;
  double timeout_s_;
  volatile ErrorRecord* error_host_ = nullptr;
  ErrorRecord* error_dev_ = nullptr;
  mutable StreamChain chain_;
  cudaEvent_t eager_done_ = nullptr, capture_done_ = nullptr;  // the last call's, per chain
  mutable cudaEvent_t pending_ = nullptr;  // the event the call being enqueued will record
};

// fused_layer on every rank of `ranks` (production: this process's one; harness: every simulated
// rank, `simulated` = one cooperative launch, rank `absent` never arriving when >= 0; the harness's
// world of one can also take the production launch). Replicated calls must fit the Lamport
// mailbox, sharded ones a half (reduction_path / exchange_path).
std::vector<LayerOutputs> run_fused_layer(const std::vector<const SymmWorkspace*>& ranks,
                                          const std::vector<LayerTensors>& inputs,
                                          const MhcScalars& s, bool sharded, int64_t num_tokens,
                                          bool simulated, int64_t absent);

// A plain collective on every rank of `ranks` (same conventions); false when the call does not
// fit the transport (the caller then uses another one).
bool run_collective(const std::vector<const SymmWorkspace*>& ranks, boundary::Op op,
                    const std::vector<Tensor>& outs, const std::vector<Tensor>& ins,
                    int64_t num_tokens, bool simulated, int64_t absent);

// The group's transport for CUDA tensors. fused_layer runs the one-kernel boundaries when the call
// fits them (replicated: the Lamport mailbox; sharded: a half); every other fused call is composed
// from this transport's collectives and the math ops, and a collective that does not fit the
// buffer (or reduces another dtype than bf16) goes to the NCCL communicator kept as the fallback
// (none when ranks share a GPU: such a call raises).
class SymmCommunicator final : public Communicator, public FusedBoundary {
 public:
  SymmCommunicator(std::string group, std::unique_ptr<SymmWorkspace> workspace,
                   std::unique_ptr<Communicator> fallback);
  const char* transport() const override { return "symm"; }
  void all_gather(Tensor& out, const Tensor& in) override;
  void reduce_scatter(Tensor& out, const Tensor& in) override;
  void all_reduce(Tensor& out, const Tensor& in) override;
  FusedBoundary* fused() override { return this; }
  EntryOutputs fused_entry(const EntryArgs& a) override;
  LayerOutputs fused_layer(const LayerArgs& a) override;
  HeadOutputs fused_head(const HeadArgs& a) override;
  const SymmWorkspace& workspace() const { return *ws_; }

 private:
  bool collective(boundary::Op op, Tensor& out, const Tensor& in);
  Communicator& fallback(const Tensor& in);  // ValueError when there is none
  bool kernels_take(const LayerArgs& a) const;
  GroupHandle handle() { return GroupHandle{ws_->rank(), ws_->world(), this}; }
  std::string group_;
  std::unique_ptr<SymmWorkspace> ws_;
  std::unique_ptr<Communicator> fallback_;  // NCCL; null when the ranks share a GPU
};

// The single-GPU harness: `world` simulated ranks, each with its own buffer (plain device memory
// on this GPU), the pointer table of all of them, its own counters and error record.
class SymmSimGroup {
 public:
  SymmSimGroup(int64_t world, int64_t device, int64_t mailbox_slot_bytes, int64_t half_bytes,
               double timeout_s);
  int64_t world() const { return static_cast<int64_t>(ranks_.size()); }
  std::vector<const SymmWorkspace*> ranks() const;
  const SymmWorkspace& rank(int64_t r) const;

 private:
  std::vector<Tensor> buffers_;
  std::vector<std::unique_ptr<SymmWorkspace>> ranks_;
};

}  // namespace mhc_sp::symm
