// SPDX-License-Identifier: Apache-2.0
#pragma once
// One group's shared-memory workspace on one rank: the protocol of
// mhc_sp/detail/boundary_protocol.h over a POSIX segment (transport/shm/segment.h) mapped into this
// process, its barriers waited for by transport/shm/waiter.h, and the calls that run through it.

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "mhc_sp/detail/boundary_protocol.h"
#include "transport/shm/segment.h"
#include "transport/shm/waiter.h"

namespace mhc_sp::shm {

class Workspace;

// One call in flight (rules 2-4 of the protocol): this rank's half, every rank's half, the layout
// the call's header implies. Holds the workspace for the call's duration; a call abandoned by an
// exception marks the workspace broken, so that peers waiting for this rank fail at once.
class Call {
 public:
  Call(Call&&) = delete;
  ~Call();

  uint8_t* in() const { return halves_[rank_] + layout_.in_offset; }
  uint8_t* out() const { return halves_[rank_] + layout_.out_offset; }
  const uint8_t* peer_in(int64_t r) const { return halves_[r] + layout_.in_offset; }
  const uint8_t* peer_out(int64_t r) const { return halves_[r] + layout_.out_offset; }
  int64_t world() const { return static_cast<int64_t>(halves_.size()); }
  int64_t rank() const { return rank_; }

  // `bytes` from `src` into this rank's `in` / `out` rows (rule 6: checked between chunks).
  void write_in(const void* src, int64_t offset, int64_t bytes);
  void write_out(const void* src, int64_t offset, int64_t bytes);
  // The first barrier: every rank's header and `in` rows are published, and the headers agree.
  void publish();
  // A later barrier: every rank's `out` rows are published.
  void barrier();
  // The call completed on this rank.
  void finish() { done_ = true; }

 private:
  friend class Workspace;
  Call(Workspace& ws, std::unique_lock<std::mutex> lock, const bp::CallHeader& h);

  Workspace& ws_;
  std::unique_lock<std::mutex> lock_;
  bp::CallHeader header_;
  bp::CallLayout layout_;
  int64_t rank_;
  std::vector<uint8_t*> halves_;
  bool done_ = false;
};

class Workspace {
 public:
  // Collective: rank 0 creates `segment`, the others map it, rank 0 unlinks it once all have.
  Workspace(std::string group, int64_t rank, int64_t world, const std::string& segment,
            std::chrono::milliseconds timeout);
  // Unlinks the current segment's name in case rank 0 could not (no error when it is gone).
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // Starts a call (rules 2, 4, 7): fails at once on a broken workspace, grows the workspace with
  // every peer when the call needs more room, writes this rank's CallHeader.
  Call start(bp::Op op, uint32_t flags, int64_t rows, int64_t num_tokens, int64_t inner,
             at::ScalarType dtype);

  int64_t rank() const { return rank_; }
  int64_t world() const { return world_; }
  const std::string& group() const { return group_; }
  int64_t half_bytes() const { return seg_.half_bytes(); }

 private:
  friend class Call;
  // Why this rank gives up on the workspace, and what it raises.
  struct Failure {
    std::string reason;   // kept: every later call reports it
    std::string message;  // raised, as a ValueError when value_error
    int64_t culprit;      // the rank blamed in the segment for `fault`; -1: nothing is written
    bp::Fault fault;
    bool value_error;
  };
  // The one way a call fails: records the failure, marks the workspace broken (rule 6), unlinks
  // the segment's name. fail() then raises; an abandoned call (Call's destructor) only records.
  void give_up(const Failure& f);
  [[noreturn]] void fail(const Failure& f);
  // A rank has marked the workspace broken (rule 6): the failure names the rank it blamed.
  Failure peer_gave_up(const char* what) const;
  // fail(peer_gave_up(what)) when the workspace is marked broken.
  void stop_if_broken(const char* what);
  // Arrives at the next epoch and waits for every peer (rule 3); `what` names the call in errors.
  // Fails, without arriving, on a workspace a peer gave up on.
  void arrive_and_wait(const char* what);
  // arrive_and_wait, then fails if a peer gave up meanwhile (rule 6).
  void barrier(const char* what);
  // Rule 4 over the headers in `half`: a ValueError naming the argument the ranks disagree on.
  void check_headers(int64_t half);
  void grow(int64_t need);
  // Copies into this rank's slot in chunks, stopping when a peer gives up (rule 6).
  void write_checked(uint8_t* dst, const void* src, int64_t bytes, const char* what);
  // "rank R <why>" for the blamed word, or "" when nobody is blamed.
  std::string blame() const;

  std::string group_;
  std::string name_;      // the first segment's name; grown segments add "_<generation>"
  std::string seg_name_;  // the mapped segment's name (unlinked on failure and destruction)
  int64_t generation_ = 0;
  int64_t rank_, world_;
  Waiter waiter_;
  std::mutex mutex_;  // one call at a time per process
  Segment seg_;
  uint64_t epoch_ = 0;  // barriers passed in seg_
  uint64_t calls_ = 0;
  std::string broken_;  // why this workspace is unusable ("" while it is usable)
};

}  // namespace mhc_sp::shm
