// SPDX-License-Identifier: Apache-2.0
#pragma once
// The current stream on the emulated device (test-only): one synchronous stream per device, the
// current device being the calling host thread's (cudaSetDevice, CUDAGuard).

#include <c10/core/Device.h>

#include "cuda_runtime.h"

namespace mhc_sp::emulation {
cudaStream_t device_stream(int device);
}  // namespace mhc_sp::emulation

namespace c10::cuda {

class CUDAStream {
 public:
  explicit CUDAStream(cudaStream_t s) : stream_(s) {}
  cudaStream_t stream() const { return stream_; }
  operator cudaStream_t() const { return stream_; }

 private:
  cudaStream_t stream_;
};

// The stream of `device` (-1, or a CPU tensor's index: the current device).
inline CUDAStream getCurrentCUDAStream(c10::DeviceIndex device = -1) {
  int d = device;
  if (d < 0) cudaGetDevice(&d);
  return CUDAStream(::mhc_sp::emulation::device_stream(d));
}

}  // namespace c10::cuda
