// SPDX-License-Identifier: Apache-2.0
#pragma once
// CUDAGuard for the emulated device (test-only): the emulated device's memory is host memory, so
// a guard on a CPU device keeps the current device as it is.

#include <c10/core/Device.h>

#include "cuda_runtime.h"

namespace c10::cuda {

class CUDAGuard {
 public:
  explicit CUDAGuard(c10::DeviceIndex index) { set(index); }
  explicit CUDAGuard(c10::Device device) { set(device.is_cpu() ? -1 : device.index()); }
  ~CUDAGuard() { cudaSetDevice(previous_); }
  CUDAGuard(const CUDAGuard&) = delete;
  CUDAGuard& operator=(const CUDAGuard&) = delete;

 private:
  void set(int index) {
    cudaGetDevice(&previous_);
    if (index >= 0) cudaSetDevice(index);
  }
  int previous_ = 0;
};

}  // namespace c10::cuda
