// SPDX-License-Identifier: Apache-2.0
#pragma once
// One rank's symm workspace (transport/symm/workspace.cpp): its buffer, which every peer maps, the
// pointer table of every rank's buffer as mapped here, device-local counters and epochs, a
// host-mapped error record the kernels fill when a wait fails, and the order of its calls across
// streams. It owns what keeps the peers' buffers mapped (the rendezvous handle), so the peers'
// memory stays mapped exactly as long as a communicator, or an op in flight, can use it.

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "transport/symm/layout.h"

namespace mhc_sp::symm {

using at::Tensor;

class SymmWorkspace {
 public:
  // Initialises this rank's own buffer (flags, armed mailboxes, header) and synchronises its
  // stream; the caller must then make every rank of the group pass a host barrier before any
  // kernel runs. `mapping` keeps the peers' buffers mapped (released last, after the device has
  // finished every kernel that may use them).
  SymmWorkspace(Tensor buffer, const std::vector<int64_t>& peer_ptrs, int64_t rank, int64_t world,
                int64_t mailbox_slot_bytes, int64_t half_bytes, double timeout_s,
                std::shared_ptr<const void> mapping = nullptr);
  ~SymmWorkspace();
  SymmWorkspace(const SymmWorkspace&) = delete;
  SymmWorkspace& operator=(const SymmWorkspace&) = delete;

  // What the kernels are given about this rank.
  RankView view() const;
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
  std::shared_ptr<const void> mapping_;  // first member: released last
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

}  // namespace mhc_sp::symm
