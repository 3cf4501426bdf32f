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

  // One outcome per rank of calls[r](group(r)), run on every rank at once (each on its own host
  // thread, its device current): the outputs, or the error the call raised. A rank whose call is
  // empty does not take part (it never arrives); delays_s[r] holds rank r back that long first.
  struct Outcome {
    std::vector<at::Tensor> outputs;
    std::string error;  // empty: the call returned
    bool value_error = false;
  };
  using Call = std::function<std::vector<at::Tensor>(const std::string& group)>;
  std::vector<Outcome> run(const std::vector<Call>& calls, const std::vector<double>& delays_s);

 private:
  std::vector<std::string> groups_;
  std::vector<int64_t> devices_;
  std::vector<at::Tensor> buffers_;
  std::vector<const symm::SymmWorkspace*> workspaces_;  // owned by the communicators
};

// The communicator of a registered emulated group (the op entries find it through group_for).
void register_emulated_group(const std::string& name, GroupHandle handle);
void unregister_emulated_group(const std::string& name);

}  // namespace mhc_sp::emulation
