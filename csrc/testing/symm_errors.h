// SPDX-License-Identifier: Apache-2.0
#pragma once
// A symm rank's error record as the tests read it (test-only: the testing module's simulated ranks
// on a GPU and the emulated device's, csrc/emulation/): None when nothing failed, else a dict.

#include <pybind11/pybind11.h>

#include "transport/symm/layout.h"

namespace mhc_sp::testing {

inline pybind11::object error_dict(const symm::ErrorRecord& e) {
  if (e.code == symm::kNoError) return pybind11::none();
  static const char* const kCodes[] = {"none", "timeout", "mismatch", "peer_broken"};
  pybind11::dict d;
  d["code"] = e.code < 4 ? kCodes[e.code] : "unknown";
  d["rank"] = e.rank;
  d["peer"] = e.peer;
  d["block"] = e.block;
  d["op"] = e.op;
  d["phase"] = e.phase;
  d["epoch"] = e.epoch;
  d["waited_s"] = static_cast<double>(e.waited_ns) * 1e-9;
  return std::move(d);
}

}  // namespace mhc_sp::testing
