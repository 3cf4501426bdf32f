// SPDX-License-Identifier: Apache-2.0
#pragma once
// A symm group of simulated ranks on emulated devices (test-only, mhc_sp._emulated): each rank
// has its own device, buffer, workspace (transport/symm/workspace.h) and communicator
// (transport/symm/communicator.h), registered under its own group name, and calls the production
// op entries (mhc_sp/ops.h) on its own host thread, as the ranks of a node do from their own
// processes. So a call runs everything production runs: the entry's checks, the fused-or-composed
// choice, the communicator, the launchers and their plans, and the kernels.

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "emulation/device.h"
#include "mhc_sp/comm.h"
#include "transport/symm/workspace.h"

namespace mhc_sp::emulation {

class World {
 public:
  // `world` ranks; rank r on emulated device devices[r] (default: device r), one device per rank.
  // A device shared with other worlds shares its resident-block slots and its call order, as one
  // GPU does.
  World(int64_t world, int64_t mailbox_slot_bytes, int64_t half_bytes, double timeout_s,
        std::vector<int64_t> devices);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int64_t size() const { return static_cast<int64_t>(workspaces_.size()); }
  const std::string& group(int64_t rank) const { return groups_.at(rank); }
  const symm::SymmWorkspace& workspace(int64_t rank) const;
  int64_t device(int64_t rank) const { return devices_.at(rank); }

  // Every rank runs its sequence of calls, calls[r][0], calls[r][1], ... (each given the rank's
  // group), on its own host thread with its device current, with no join between calls: a fast
  // rank starts its next call while a peer is still in the last one. A rank with no calls does
  // not take part (it never arrives). delays_s[r] holds rank r back that long first; every call
  // of rank r starts after a seeded random pause of up to pauses_us[r] microseconds (none given:
  // 255 for every rank when the device's delays are on). The outcome of a rank: the outputs of
  // the calls it finished, and the error that stopped it.
  struct Outcome {
    std::vector<std::vector<at::Tensor>> outputs;
    std::string error;  // empty: every call returned
    bool value_error = false;
  };
  using Call = std::function<std::vector<at::Tensor>(const std::string& group)>;
  std::vector<Outcome> run(const std::vector<std::vector<Call>>& calls,
                           const std::vector<double>& delays_s,
                           const std::vector<int64_t>& pauses_us = {});
  // When each call of the last run() started and returned on each rank (steady clock, ns: the
  // clock of emulation::launches()).
  const std::vector<std::vector<std::pair<uint64_t, uint64_t>>>& call_spans() const {
    return spans_;
  }

  // Stream capture: every rank's calls recorded on its device as a graph (nothing runs), then
  // replayed, all ranks at once, as often as wanted (the device's call counters move on).
  std::vector<std::shared_ptr<Graph>> capture(const std::vector<std::vector<Call>>& calls,
                                              std::vector<Outcome>& outcomes);
  std::vector<std::string> replay(const std::vector<std::shared_ptr<Graph>>& graphs);

 private:
  std::vector<std::string> groups_;
  std::vector<int64_t> devices_;
  std::vector<at::Tensor> buffers_;
  std::vector<const symm::SymmWorkspace*> workspaces_;  // owned by the communicators
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> spans_;
};

// The communicator of a registered emulated group (the op entries find it through group_for).
void register_emulated_group(const std::string& name, GroupHandle handle);
void unregister_emulated_group(const std::string& name);

}  // namespace mhc_sp::emulation
