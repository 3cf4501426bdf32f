// SPDX-License-Identifier: Apache-2.0
#pragma once
// Host entry points of the symmetric-memory kernels (csrc/cuda/symm_boundary.cu), callable from
// plain C++ (csrc/cuda/symm_comm.cpp). Each takes one entry per rank the launch runs: production
// passes its own rank only; the single-GPU harness passes every simulated rank (simulated = true:
// one cooperative launch with gridDim.y = ranks). Arguments are checked by the callers.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "mhc_sp/kernels.h"
#include "mhc_sp/symm.h"

namespace mhc_sp::symm {

// One rank's device handles.
struct RankHandles {
  uint8_t* const* peers;  // device array [world]: every rank's buffer as mapped here
  int rank, world;
  LocalState* state;   // device memory
  ErrorRecord* error;  // device address of a host-mapped record
  uint64_t timeout_ns;
  BufferLayout L;
  int absent;  // harness: this simulated rank never arrives
};

// fused_layer on one rank. Replicated: T = num_tokens rows everywhere, layer_input (T, H).
// Sharded: residual/post/comb/outputs are the rank's shard (shard_rows(num_tokens) rows), partial
// has at least num_tokens rows, layer_input is the gathered (num_tokens, H).
struct LayerCall {
  RankHandles h;
  const BFloat16* partial;
  PostParams post;  // x unused (reduced on the fly); T = stream rows
  PreParams pre;    // out = layer_input (replicated only; sharded writes `gathered`)
  BFloat16* gathered;
  int64_t num_tokens;
};

// Plain collective on one rank: rows of row_bytes bytes (bf16 for the reductions).
struct CollectiveCall {
  RankHandles h;
  boundary::Op op;  // kAllReduce, kReduceScatter or kAllGather
  const void* in;
  void* out;
  int64_t rows;
  int64_t row_bytes;
  int64_t num_tokens;  // all_gather: rows of the concatenation kept (-1: all)
};

// Replicated boundary through the mailbox: requires T <= kLamportMaxTokens, H % 8 == 0 and
// T * H * 2 <= mailbox_slot_bytes (the caller checks, see reduction_path).
void launch_lamport_layer(const std::vector<LayerCall>& ranks, bool simulated, cudaStream_t stream);
// Sharded boundary: two kernels (the second a programmatic dependent launch in production).
void launch_sharded_layer(const std::vector<LayerCall>& ranks, bool simulated, cudaStream_t stream);
// all_reduce through the mailbox (lamport) or the barrier exchange; reduce_scatter; all_gather.
void launch_collective(const std::vector<CollectiveCall>& ranks, bool lamport, bool simulated,
                       cudaStream_t stream);

}  // namespace mhc_sp::symm
