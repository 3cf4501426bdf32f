// SPDX-License-Identifier: Apache-2.0
#pragma once
// The NCCL transport as the rest of mhc_sp sees it (CUDA builds): an NCCL communicator that
// mhc_sp creates for a group's CUDA tensors, attached by mhc_sp.distributed.init, or kept by the
// symm transport as its fallback.

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "mhc_sp/comm.h"

namespace mhc_sp::nccl {

// A fresh NCCL unique id (rank 0 makes it, the group broadcasts it).
std::string unique_id();

// Collective over the registered group `name`: every rank creates its communicator on `device`
// from rank 0's `unique_id`, blocking until every rank joins.
std::unique_ptr<Communicator> make_communicator(const std::string& name,
                                                const std::string& unique_id, int64_t device);

// mhc_sp._C.nccl_unique_id and init_nccl_communicator (transport/nccl/bindings.cpp).
void bind(pybind11::module_& m);

}  // namespace mhc_sp::nccl
