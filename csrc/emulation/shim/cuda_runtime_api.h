// SPDX-License-Identifier: Apache-2.0
#pragma once
// The emulated device's CUDA runtime API (test-only): see cuda_runtime.h beside it.
#include "cuda_runtime.h"
