// SPDX-License-Identifier: Apache-2.0
#pragma once
// Groups registered with mhc_sp (mhc_sp.distributed.init) and the transports behind the ops'
// `str group` argument. Each registered group has at most one transport per device type, fixed at
// init: for CPU tensors the group's own gloo backend (csrc/transport/gloo/) or a same-host
// shared-memory workspace (csrc/transport/shm/); for CUDA tensors an NCCL communicator created by
// mhc_sp (csrc/transport/nccl/) or a symmetric-memory workspace over the peers' GPU buffers
// (csrc/transport/symm/). A world of one needs none ("local"). The registry
// (csrc/transport/registry.cpp) owns each transport; an op holds it for its call.

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mhc_sp/params.h"

namespace mhc_sp {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// Arguments of the fused ops, checked once by their entries (csrc/ops/sp_ops.cpp) before a
// transport sees them. `stream` and `in.shape` are the shape of this rank's residual stream.
struct EntryArgs {
  Tensor x;
  PreWeights pre;
  StreamShape stream;
  bool sharded;
};

struct LayerArgs {
  Tensor partial;
  PostInputs in;
  PreWeights pre;
  bool sharded;
  int64_t num_tokens;
};

struct HeadArgs {
  Tensor partial;
  PostInputs in;
  HeadWeights head;
  bool sharded;
  int64_t num_tokens;
};

using EntryOutputs =
    std::tuple<Tensor, Tensor, Tensor, Tensor>;  // residual, post, comb, layer_input
using LayerOutputs =
    std::tuple<Tensor, Tensor, Tensor, Tensor>;  // residual_out, post, comb, layer_input
using HeadOutputs = std::tuple<Tensor, Tensor>;  // hidden, residual_out

// A transport that runs a whole boundary (exchange, mHC math, gather) in one pass. Outputs follow
// docs/design.md §2 exactly, padding rows of the stream outputs included (zeros).
class FusedBoundary {
 public:
  virtual ~FusedBoundary() = default;
  virtual EntryOutputs fused_entry(const EntryArgs& a) = 0;
  virtual LayerOutputs fused_layer(const LayerArgs& a) = 0;
  virtual HeadOutputs fused_head(const HeadArgs& a) = 0;
};

// Out-of-place collectives over dim 0 of contiguous tensors, summing for the reductions.
class Communicator {
 public:
  virtual ~Communicator() = default;
  // "gloo", "shm", "nccl", "symm": what mhc_sp.distributed.transport() reports.
  virtual const char* transport() const = 0;
  // out (world * rows, ...) <- concatenation of every rank's in (rows, ...)
  virtual void all_gather(Tensor& out, const Tensor& in) = 0;
  // out (rows, ...) <- sum over ranks of their in[rank * rows : (rank + 1) * rows]
  virtual void reduce_scatter(Tensor& out, const Tensor& in) = 0;
  // out <- sum over ranks of in (same shape)
  virtual void all_reduce(Tensor& out, const Tensor& in) = 0;
  // The one-pass boundary, when the transport has one (else the ops compose the collectives).
  virtual FusedBoundary* fused() { return nullptr; }
};

// A registered group as seen by one op call: `comm` serves the call's device (null when world ==
// 1). The handle shares ownership of the transport, so a re-init or destroy() while the op runs
// frees it only once the op is done with it.
struct GroupHandle {
  int64_t rank;
  int64_t world;
  std::shared_ptr<Communicator> comm;
};

// The boundary composed from the group's collectives (`g.comm`) and the math ops' bodies
// (csrc/ops/sp_ops.cpp):
// what the fused ops run when the transport has no one-pass boundary, and what a FusedBoundary
// runs for calls it does not take itself.
EntryOutputs composed_fused_entry(const EntryArgs& a, const GroupHandle& g);
LayerOutputs composed_fused_layer(const LayerArgs& a, const GroupHandle& g);
HeadOutputs composed_fused_head(const HeadArgs& a, const GroupHandle& g);

// Registers `name` (rank, world) and, when world > 1 and the group has a CPU backend, gloo as its
// CPU transport. Idempotent: registering again with the same rank and world keeps the transports.
void register_group(const std::string& name, int64_t rank, int64_t world);
// Makes `comm` the group's transport for tensors of `device_type` (CUDA: on `device_index`).
void attach_communicator(const std::string& name, c10::DeviceType device_type, int64_t device_index,
                         std::shared_ptr<Communicator> comm);
void unregister_all_groups();
// Rank and world of a registered group (comm left null).
GroupHandle registered_group(const std::string& name);
// The transport serving `device_type` tensors: "local" for a world of one, "" when there is none.
std::string group_transport(const std::string& name, c10::DeviceType device_type);

// The group `name` for a collective on tensor `t` (named `arg` in errors), holding its transport
// for the call. ValueError when the group is unknown to mhc_sp or has no transport for t's device.
GroupHandle group_for(const std::string& name, const Tensor& t, const char* arg);

// dst <- the sum of `count` elements at each of parts[0], parts[1], ... (rank order) from +0, in
// fp32 for bf16/fp16 data, rounded once to `dtype` (csrc/transport/rank_order_sum.cpp): the one
// reduction rule of the CPU transports.
void rank_order_sum(void* dst, const std::vector<const void*>& parts, int64_t count,
                    at::ScalarType dtype);

// CPU transports (csrc/transport/gloo/, csrc/transport/shm/). Each is collective over the group:
// every rank calls it.
std::unique_ptr<Communicator> make_gloo_communicator(const std::string& name);
// A fresh unguessable POSIX shared-memory name (rank 0 makes it, the group broadcasts it).
std::string new_shm_segment_name();
// Rank 0 creates `segment`, the others map it, rank 0 unlinks it once all have. Waits on peers
// are bounded by `timeout`.
std::unique_ptr<Communicator> make_shm_communicator(const std::string& name,
                                                    const std::string& segment,
                                                    std::chrono::milliseconds timeout);

#if defined(MHC_SP_WITH_CUDA)
// NCCL setup (csrc/transport/nccl/communicator.cpp): rank 0 makes the id, the group broadcasts it,
// every rank then creates its communicator on `device` and attaches it to the registered group
// `name`.
std::string nccl_unique_id();
void init_nccl_communicator(const std::string& name, const std::string& unique_id, int64_t device);
// The same communicator, returned instead of attached (the symm transport keeps it as its
// fallback).
std::unique_ptr<Communicator> make_nccl_communicator(const std::string& name,
                                                     const std::string& unique_id, int64_t device);
#endif

}  // namespace mhc_sp
