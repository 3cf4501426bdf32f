// SPDX-License-Identifier: Apache-2.0
// mhc_sp._C bindings of the gloo transport's setup, driven by mhc_sp.distributed.init.

#include "transport/gloo/transport.h"

namespace mhc_sp::gloo {

void bind(pybind11::module_& m) {
  m.def(
      "init_gloo_transport",
      [](const std::string& name) {
        attach_communicator(name, c10::DeviceType::CPU, -1, make_communicator(name));
      },
      pybind11::arg("name"));
}

}  // namespace mhc_sp::gloo
