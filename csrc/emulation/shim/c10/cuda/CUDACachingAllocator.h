// SPDX-License-Identifier: Apache-2.0
#pragma once
// The emulated device's allocator (test-only): host memory, 256-byte aligned and filled with
// all-ones bytes (NaN as floats), so that a kernel that reads what nobody wrote gets NaN rather
// than a lucky zero.

#include <c10/core/Allocator.h>

namespace c10::cuda::CUDACachingAllocator {

c10::Allocator* get();

}  // namespace c10::cuda::CUDACachingAllocator
