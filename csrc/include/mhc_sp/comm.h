// SPDX-License-Identifier: Apache-2.0
#pragma once
// The transport interface (Communicator, with an optional FusedBoundary) and the registry of
// groups initialised with mhc_sp (mhc_sp.distributed.init) behind the ops' `str group` argument.
// Each registered group has at most one transport per device type, fixed at init: for CPU tensors
// the group's own gloo backend (csrc/transport/gloo/) or a same-host shared-memory workspace
// (csrc/transport/shm/); for CUDA tensors an NCCL communicator created by mhc_sp
// (csrc/transport/nccl/) or a symmetric-memory workspace over the peers' GPU buffers
// (csrc/transport/symm/). A world of one needs none ("local"). The registry
// (csrc/transport/registry.cpp) owns each transport; an op holds it for its call. Each transport's
// factory and setup bindings are in its own folder (transport/<name>/transport.h). The fused ops
// that a transport does not take are composed from its collectives by the ops themselves
// (csrc/ops/sp_ops.cpp): a transport never calls back into the ops.

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "mhc_sp/detail/params.h"

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
// docs/design.md §2 exactly, padding rows of the stream outputs included (zeros). A call the
// transport does not take (it does not fit its buffers, or it has no one-pass form of that
// boundary) returns nullopt, before anything is exchanged: the op then composes it from the
// collectives.
class FusedBoundary {
 public:
  virtual ~FusedBoundary() = default;
  virtual std::optional<EntryOutputs> fused_entry(const EntryArgs& a) = 0;
  virtual std::optional<LayerOutputs> fused_layer(const LayerArgs& a) = 0;
  virtual std::optional<HeadOutputs> fused_head(const HeadArgs& a) = 0;
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

}  // namespace mhc_sp
