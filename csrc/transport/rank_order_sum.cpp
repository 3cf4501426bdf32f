// SPDX-License-Identifier: Apache-2.0
// The reduction every CPU transport makes (boundary protocol rule 5, docs/design.md §3b): the
// parts added in rank order into an accumulator that starts at +0 (fp32 for bf16/fp16, the data's
// own type otherwise), rounded once to the data's type. Every rank that sums the same parts gets
// the same bits, whatever the transport; an all -0 position gives +0.

#include "transport/rank_order_sum.h"

namespace mhc_sp {

void rank_order_sum(void* dst, const std::vector<const void*>& parts, int64_t count,
                    at::ScalarType dtype) {
  const auto opts = at::TensorOptions().dtype(dtype);
  const auto acc_type = at::isReducedFloatingType(dtype) ? at::kFloat : dtype;
  at::Tensor acc = at::zeros({count}, opts.dtype(acc_type));
  for (const void* p : parts) acc.add_(at::from_blob(const_cast<void*>(p), {count}, opts));
  at::from_blob(dst, {count}, opts).copy_(acc);
}

}  // namespace mhc_sp
