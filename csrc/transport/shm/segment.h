// SPDX-License-Identifier: Apache-2.0
#pragma once
// The POSIX shared-memory segments of the shm transport (mhc_sp/detail/boundary_protocol.h lays
// them out): create, open, map and unlink one, and read its regions. No protocol logic: the
// workspace (transport/shm/workspace.h) drives the segments.

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "mhc_sp/detail/boundary_protocol.h"

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

// Creates, sizes (reserving the memory, so that a full /dev/shm is an error here rather than a
// SIGBUS later) and maps a segment only this user can open, its header written.
Segment create_segment(const std::string& name, int64_t world, int64_t half_bytes);

// Opens and maps a segment made by rank 0, waiting until `deadline` for it to exist and be
// complete. The segment is trusted only after it proves to be this user's private, complete, and
// of the geometry the caller expects (half_bytes < 0: any).
Segment open_segment(const std::string& name, int64_t world, int64_t half_bytes,
                     std::chrono::steady_clock::time_point deadline);

// Removes a segment's name; a name already removed (by rank 0 or a peer) is no error.
void unlink_segment(const std::string& name);

// Unlinks a segment's name when it goes out of scope (an error on the way), unless kept.
class UnlinkOnExit {
 public:
  explicit UnlinkOnExit(std::string name) : name_(std::move(name)) {}
  UnlinkOnExit(const UnlinkOnExit&) = delete;
  UnlinkOnExit& operator=(const UnlinkOnExit&) = delete;
  ~UnlinkOnExit() { unlink_segment(name_); }
  void keep() { name_.clear(); }

 private:
  std::string name_;
};

}  // namespace mhc_sp::shm
