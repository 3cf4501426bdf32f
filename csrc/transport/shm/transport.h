// SPDX-License-Identifier: Apache-2.0
#pragma once
// The shm transport as the rest of mhc_sp sees it: a same-host CPU transport over one POSIX
// shared-memory workspace per group (transport/shm/workspace.h), set up from Python by
// mhc_sp.distributed through the bindings below.

#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>
#include <string>

#include "mhc_sp/comm.h"

namespace mhc_sp::shm {

// A fresh unguessable POSIX shared-memory name (rank 0 makes it, the group broadcasts it).
std::string new_segment_name();

// Collective over the registered group `name`: rank 0 creates `segment`, the others map it, rank 0
// unlinks it once all have. Waits on peers are bounded by `timeout`.
std::unique_ptr<Communicator> make_communicator(const std::string& name, const std::string& segment,
                                                std::chrono::milliseconds timeout);

// mhc_sp._C.new_shm_segment_name and init_shm_transport (transport/shm/bindings.cpp).
void bind(pybind11::module_& m);

}  // namespace mhc_sp::shm
