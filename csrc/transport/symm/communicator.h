// SPDX-License-Identifier: Apache-2.0
#pragma once
// The group's transport for CUDA tensors over symmetric memory (transport/symm/communicator.cpp).

#include <memory>
#include <optional>
#include <string>

#include "mhc_sp/comm.h"
#include "transport/symm/workspace.h"

namespace mhc_sp::symm {

// fused_layer runs the symm kernels when the call fits them (replicated: the Lamport mailbox;
// sharded: a half); every other fused call is declined (nullopt), and the op composes it from
// this transport's collectives and the math ops' bodies. A collective that does not fit the buffer
// (or reduces another dtype than bf16) goes to the NCCL communicator kept as the fallback (none
// when ranks share a GPU: such a call raises).
class SymmCommunicator final : public Communicator, public FusedBoundary {
 public:
  SymmCommunicator(std::string group, std::unique_ptr<SymmWorkspace> workspace,
                   std::shared_ptr<Communicator> fallback);
  const char* transport() const override { return "symm"; }
  void all_gather(Tensor& out, const Tensor& in) override;
  void reduce_scatter(Tensor& out, const Tensor& in) override;
  void all_reduce(Tensor& out, const Tensor& in) override;
  FusedBoundary* fused() override { return this; }
  std::optional<EntryOutputs> fused_entry(const EntryArgs& a) override;
  std::optional<LayerOutputs> fused_layer(const LayerArgs& a) override;
  std::optional<HeadOutputs> fused_head(const HeadArgs& a) override;

 private:
  bool collective(boundary::Op op, Tensor& out, const Tensor& in);
  Communicator& fallback(const Tensor& in);  // ValueError when there is none
  bool kernels_take(const LayerArgs& a) const;

  std::string group_;
  std::unique_ptr<SymmWorkspace> ws_;
  std::shared_ptr<Communicator> fallback_;  // NCCL; null when the ranks share a GPU
};

}  // namespace mhc_sp::symm
