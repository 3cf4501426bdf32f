// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Python class of the single-GPU symm harness (testing/symm_sim.h), SymmSimGroup: bound by
// the testing module in CUDA builds (a GPU) and by the emulated device's module (its kernels run
// on the emulated device: the same sources, built for the host).

#include <pybind11/pybind11.h>

namespace mhc_sp::testing {

void bind_symm_sim(pybind11::module_& m);

}  // namespace mhc_sp::testing
