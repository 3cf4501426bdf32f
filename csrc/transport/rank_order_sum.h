// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one reduction rule of the CPU transports (transport/rank_order_sum.cpp).

#include <ATen/ATen.h>

#include <vector>

namespace mhc_sp {

// dst <- the sum of `count` elements at each of parts[0], parts[1], ... (rank order) from +0, in
// fp32 for bf16/fp16 data, rounded once to `dtype`.
void rank_order_sum(void* dst, const std::vector<const void*>& parts, int64_t count,
                    at::ScalarType dtype);

}  // namespace mhc_sp
