// SPDX-License-Identifier: Apache-2.0
#pragma once
// The symm transport as the rest of mhc_sp sees it: a CUDA transport over torch symmetric memory
// (transport/symm/communicator.h), set up from Python by mhc_sp.distributed.init through
// python/mhc_sp/transports/symm.py and the bindings below.

#include <pybind11/pybind11.h>

namespace mhc_sp::symm {

// mhc_sp._C bindings of the transport (transport/symm/bindings.cpp): its constants and buffer
// layout in every build; the peer-link query and init_symm_transport in CUDA builds.
void bind(pybind11::module_& m);

}  // namespace mhc_sp::symm
