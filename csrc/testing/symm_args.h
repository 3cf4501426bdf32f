// SPDX-License-Identifier: Apache-2.0
#pragma once
// Op names and call headers as the tests spell them (test-only: the testing module's host
// arithmetic and the simulated ranks of the harness, on a GPU and on the emulated device).

#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

#include "transport/symm/layout.h"

namespace mhc_sp::testing {

inline boundary::Op checked_op(const std::string& op) {
  using boundary::Op;
  if (op == "all_gather") return Op::kAllGather;
  if (op == "reduce_scatter") return Op::kReduceScatter;
  if (op == "all_reduce") return Op::kAllReduce;
  if (op == "fused_entry") return Op::kFusedEntry;
  if (op == "fused_layer") return Op::kFusedLayer;
  if (op == "fused_head") return Op::kFusedHead;
  TORCH_CHECK_VALUE(false,
                    "op: expected all_gather, reduce_scatter, all_reduce, fused_entry, "
                    "fused_layer or fused_head, got '",
                    op, "'");
}

inline symm::CallHeader header_of(const std::string& op, bool sharded, int64_t rows,
                                  int64_t num_tokens, int64_t inner, int64_t elem_bytes) {
  TORCH_CHECK_VALUE(rows >= 0, "rows: expected a value >= 0, got ", rows);
  TORCH_CHECK_VALUE(inner >= 1, "inner: expected a value >= 1, got ", inner);
  TORCH_CHECK_VALUE(elem_bytes >= 1 && elem_bytes <= 8, "elem_bytes: expected 1 to 8, got ",
                    elem_bytes);
  symm::CallHeader h{};
  h.op = static_cast<uint32_t>(checked_op(op));
  h.flags = sharded ? boundary::kSharded : 0;
  h.rows = rows;
  h.num_tokens = num_tokens;
  h.inner = inner;
  h.elem_bytes = static_cast<uint32_t>(elem_bytes);
  return h;
}

}  // namespace mhc_sp::testing
