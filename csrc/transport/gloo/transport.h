// SPDX-License-Identifier: Apache-2.0
#pragma once
// The gloo transport as the rest of mhc_sp sees it: the group's own CPU backend, every group's
// CPU transport unless another is attached (the registry makes it at register_group).

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "mhc_sp/comm.h"

namespace mhc_sp::gloo {

// The transport over the torch.distributed group `name`'s CPU backend. ValueError (naming
// `group` or `transport`) when the group is unknown or has no CPU backend.
std::unique_ptr<Communicator> make_communicator(const std::string& name);

// mhc_sp._C.init_gloo_transport (transport/gloo/bindings.cpp).
void bind(pybind11::module_& m);

}  // namespace mhc_sp::gloo
