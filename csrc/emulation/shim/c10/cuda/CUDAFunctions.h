// SPDX-License-Identifier: Apache-2.0
#pragma once
// c10::cuda::device_count for the emulated device (test-only): the emulated devices.

#include <c10/core/Device.h>

#include "cuda_runtime.h"

namespace c10::cuda {

inline c10::DeviceIndex device_count() {
  return static_cast<c10::DeviceIndex>(::mhc_sp::emulation::device_count());
}

}  // namespace c10::cuda
