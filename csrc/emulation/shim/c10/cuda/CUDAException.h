// SPDX-License-Identifier: Apache-2.0
#pragma once
// C10_CUDA_CHECK for the emulated device (test-only): a failed call raises with what failed.

#include <c10/util/Exception.h>

#include "cuda_runtime.h"

#define C10_CUDA_CHECK(expr)                                                         \
  do {                                                                               \
    const cudaError_t mhc_sp_emulated_error = (expr);                                \
    TORCH_CHECK(mhc_sp_emulated_error == cudaSuccess,                                \
                "emulated CUDA error: ", cudaGetErrorString(mhc_sp_emulated_error)); \
  } while (0)

#define C10_CUDA_KERNEL_LAUNCH_CHECK() C10_CUDA_CHECK(cudaGetLastError())
