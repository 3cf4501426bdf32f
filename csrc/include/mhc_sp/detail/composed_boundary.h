// SPDX-License-Identifier: Apache-2.0
#pragma once
// The boundary composed from the group's collectives (`g.comm`) and the math ops' bodies
// (csrc/ops/sp_ops.cpp): what the fused ops run when the transport has no one-pass boundary, and
// what a FusedBoundary runs for calls it does not take itself.

#include "mhc_sp/comm.h"

namespace mhc_sp {

EntryOutputs composed_fused_entry(const EntryArgs& a, const GroupHandle& g);
LayerOutputs composed_fused_layer(const LayerArgs& a, const GroupHandle& g);
HeadOutputs composed_fused_head(const HeadArgs& a, const GroupHandle& g);

}  // namespace mhc_sp
