// SPDX-License-Identifier: Apache-2.0
// mhc_sp._C bindings of the shm transport's setup, driven by mhc_sp.distributed.init.

#include "transport/shm/transport.h"

namespace mhc_sp::shm {

void bind(pybind11::module_& m) {
  m.def("new_shm_segment_name", &new_segment_name);
  m.def(
      "init_shm_transport",
      [](const std::string& name, const std::string& segment, double timeout_s) {
        const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
        pybind11::gil_scoped_release no_gil;  // waits for every rank to map the segment
        attach_communicator(name, c10::DeviceType::CPU, -1,
                            make_communicator(name, segment, timeout));
      },
      pybind11::arg("name"), pybind11::arg("segment"), pybind11::arg("timeout_s"));
}

}  // namespace mhc_sp::shm
