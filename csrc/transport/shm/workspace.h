// SPDX-License-Identifier: Apache-2.0
#pragma once
// One group's shared-memory workspace on one rank: the POSIX segment of
// mhc_sp/boundary_protocol.h mapped into this process, and the calls that run through it.

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "mhc_sp/boundary_protocol.h"

namespace mhc_sp::shm {

namespace bp = ::mhc_sp::boundary;

// A mapped segment (unmapped on destruction).
class Segment {
 public:
  Segment() = default;
  Segment(uint8_t* base, int64_t bytes) : base_(base), bytes_(bytes) {}
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  uint8_t* base() const { return base_; }
  int64_t bytes() const { return bytes_; }
  bp::SegmentHeader* header() const { return reinterpret_cast<bp::SegmentHeader*>(base_); }
  bp::RankControl* control(int64_t rank) const {
    return reinterpret_cast<bp::RankControl*>(base_ + bp::control_offset()) + rank;
  }
  int64_t half_bytes() const { return static_cast<int64_t>(header()->half_bytes); }
  int64_t world() const { return header()->world; }
  uint8_t* half(int64_t rank, int64_t half) const {
    return base_ + bp::half_offset(world(), half_bytes(), rank, half);
  }

 private:
  uint8_t* base_ = nullptr;
  int64_t bytes_ = 0;
};

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
  // Arrives at the next epoch and waits for every peer (rule 3); `what` names the call in errors.
  // Fails, without arriving, on a workspace a peer gave up on.
  void arrive_and_wait(const char* what);
  // arrive_and_wait, then fails if a peer gave up meanwhile (rule 6).
  void barrier(const char* what);
  void fail_if_peer_gave_up(const char* what);
  void check_headers(int64_t half);
  void grow(int64_t need);
  // Copies into this rank's slot in chunks, stopping when a peer gives up (rule 6).
  void write_checked(uint8_t* dst, const void* src, int64_t bytes, const char* what);
  // Marks the workspace broken, blaming `culprit` for `why`, and throws `message`.
  [[noreturn]] void fail(const std::string& message, int64_t culprit, bp::Fault why);
  // A peer marked the workspace broken: throws, naming the rank it blamed.
  [[noreturn]] void fail_after_peer(const char* what);
  void check_usable(const char* what);
  // "rank R <why>" for the blamed word, or "" when nobody is blamed.
  std::string blame() const;

  std::string group_;
  std::string name_;      // the first segment's name; grown segments add "_<generation>"
  std::string seg_name_;  // the mapped segment's name (unlinked on failure and destruction)
  int64_t generation_ = 0;
  int64_t rank_, world_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds spin_for_;  // how long a wait spins before it sleeps
  std::mutex mutex_;                    // one call at a time per process
  Segment seg_;
  uint64_t epoch_ = 0;  // barriers passed in seg_
  uint64_t calls_ = 0;
  std::string broken_;  // why this workspace is unusable ("" while it is usable)
};

// Name of the op behind a protocol Op, for errors.
const char* op_name(bp::Op op);

}  // namespace mhc_sp::shm
