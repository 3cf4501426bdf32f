// SPDX-License-Identifier: Apache-2.0
#pragma once
// Runtime hc_mult -> compile-time N, so per-stream arrays live in registers and loops unroll.

#include <c10/util/Exception.h>

#include <cstdint>
#include <type_traits>

#include "mhc_sp/detail/scalars.h"

namespace mhc_sp {

template <typename F>
void dispatch_hc_mult(int64_t n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
  }
  TORCH_CHECK(false, "hc_mult ", n, " is outside [1, ", kMaxHcMult, "]");
}

}  // namespace mhc_sp
