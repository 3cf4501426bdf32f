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
#include <mutex>
#include <string>
#include <vector>

#include "transport/symm/layout.h"

namespace mhc_sp::symm {

using at::Tensor;

// The order of every symm call on one device, whatever its group, stream or host thread, eager
// or replayed from a CUDA graph: each call's stream waits for the previous call's event first
// and records the event after its kernels (inside a stream capture as external event nodes, so
// that every replay waits and records too), and a mutex is held from the wait to the record. So
// two symm kernels of this process never spin on one GPU at the same time (between them they
// could fill every SM with blocks that wait for counterparts that cannot start), and the ranks of
// a group, which issue their calls in one program order, run them in that order on every GPU.
class CallOrder {
 public:
  // The device's order, made on first use (process-wide, never destroyed: kernels enqueued before
  // exit may still use its event).
  static CallOrder& of_device(int device);
  // Waits on the host until the device's last call so far has finished.
  void synchronize();

  // One call's place in the order: from begin() (waits for the previous call) to the end of its
  // lifetime (records this call), also when a launch between them throws.
  class Turn {
   public:
    Turn(CallOrder& order, cudaStream_t stream);
    ~Turn();
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    std::unique_lock<std::mutex> lock_;
    CallOrder& order_;
    cudaStream_t stream_;
    bool captured_;
  };

 private:
  explicit CallOrder(int device);
  std::mutex mutex_;
  cudaEvent_t last_ = nullptr;
};

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
  // A call's turn on this workspace's device (CallOrder): hold it while its kernels are enqueued.
  CallOrder::Turn turn(cudaStream_t stream) const { return CallOrder::Turn(*order_, stream); }
  int64_t rank() const { return rank_; }
  int64_t world() const { return world_; }
  const BufferLayout& layout() const { return layout_; }
  // What the kernels recorded (code 0: nothing failed). A host read, no device sync.
  ErrorRecord error() const;
  // The device's counters (calls done, arrivals, the decode tile counter), copied back: for tests,
  // once the calls have finished.
  LocalState local_state() const;
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
  CallOrder* order_ = nullptr;  // the device's
};

}  // namespace mhc_sp::symm
