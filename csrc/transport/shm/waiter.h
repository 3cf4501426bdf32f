// SPDX-License-Identifier: Apache-2.0
#pragma once
// The shm transport's barrier wait (rule 3 of mhc_sp/detail/boundary_protocol.h): arrive, then wait
// for every peer, spinning through the short waits of balanced ranks and sleeping on the peer's
// futex word after that, with a liveness probe of the late peer every few milliseconds. The waiter
// never throws: it reports why it stopped waiting, and the workspace fails (workspace.h).

#include <chrono>
#include <cstdint>

#include "transport/shm/segment.h"

namespace mhc_sp::shm {

// Why a wait ended before every peer arrived.
enum class Stall {
  kNone,      // every peer arrived
  kGaveUp,    // a rank marked the workspace broken (rule 6)
  kLeft,      // the late peer left the workspace (its group was destroyed or initialised again)
  kExited,    // the late peer's process is gone
  kTimedOut,  // the late peer did not arrive within the timeout
};

struct WaitResult {
  Stall stall = Stall::kNone;
  int64_t peer = -1;  // the late peer (every stall but kNone)
  int64_t pid = 0;    // its process id (kLeft, kExited)
};

class Waiter {
 public:
  // `world` ranks share the cores this process may run on; a wait gives up after `timeout`.
  Waiter(int64_t world, std::chrono::milliseconds timeout);

  // Publishes epoch `e` as this rank's arrival (`mine`) and wakes the peers asleep on it.
  static void arrive(bp::RankControl* mine, uint64_t e);
  // Waits until every peer of `rank` in `seg` has arrived at epoch `e`, or returns why not.
  WaitResult wait_for_peers(const Segment& seg, int64_t rank, uint64_t e) const;

  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::chrono::microseconds spin_for_;  // how long a wait spins before it sleeps
  std::chrono::milliseconds timeout_;
};

}  // namespace mhc_sp::shm
