// SPDX-License-Identifier: Apache-2.0
// mhc_sp._C bindings of the NCCL transport's setup, driven by mhc_sp.distributed.init (CUDA
// builds).

#include "transport/nccl/transport.h"

namespace mhc_sp::nccl {

void bind(pybind11::module_& m) {
  m.def("nccl_unique_id", [] { return pybind11::bytes(unique_id()); });
  m.def("init_nccl_communicator", [](const std::string& name, pybind11::bytes unique_id,
                                     int64_t device) {
    const std::string id = unique_id;
    pybind11::gil_scoped_release no_gil;  // blocks until every rank joins
    attach_communicator(name, c10::DeviceType::CUDA, device, make_communicator(name, id, device));
  });
}

}  // namespace mhc_sp::nccl
