// SPDX-License-Identifier: Apache-2.0
#pragma once
// The token shard arithmetic of sequence parallelism (docs/design.md §2): a sharded tensor of
// `tokens` rows is zero-padded to a multiple of the world, and each rank owns ceil(tokens / world)
// consecutive rows of it. Plain integer functions, for host code and CUDA kernels alike.

#include <cstdint>

#if defined(__CUDACC__)
#define MHC_SP_HOST_DEVICE __host__ __device__
#else
#define MHC_SP_HOST_DEVICE
#endif

namespace mhc_sp {

// ceil(tokens / world): the rows of each rank's token shard.
MHC_SP_HOST_DEVICE constexpr int64_t shard_rows(int64_t tokens, int64_t world) {
  return (tokens + world - 1) / world;
}

// Real (non-padding) rows of `rank`'s shard of `tokens` rows: the rest of its shard is padding.
MHC_SP_HOST_DEVICE constexpr int64_t shard_valid_rows(int64_t tokens, int64_t world, int64_t rank) {
  const int64_t shard = shard_rows(tokens, world);
  const int64_t left = tokens - rank * shard;
  return left <= 0 ? 0 : (left < shard ? left : shard);
}

}  // namespace mhc_sp
