// SPDX-License-Identifier: Apache-2.0
// The symm transport for CUDA tensors: the communicator the ops use over this rank's workspace
// (transport/symm/workspace.h; the peer buffers come from torch symmetric memory at
// mhc_sp.distributed.init, see python/mhc_sp/transports/symm.py). Collectives that do not fit the
// workspace (or a dtype the kernels do not reduce) go to the group's NCCL communicator, which the
// transport keeps; fused calls the kernels do not take are declined, and the op composes them.

#include "transport/symm/communicator.h"

#include <c10/cuda/CUDAStream.h>

#include "transport/symm/kernels.h"

namespace mhc_sp::symm {
namespace {

cudaStream_t current_stream(const Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

}  // namespace

SymmCommunicator::SymmCommunicator(std::string group, std::unique_ptr<SymmWorkspace> workspace,
                                   std::shared_ptr<Communicator> fallback)
    : group_(std::move(group)), ws_(std::move(workspace)), fallback_(std::move(fallback)) {}

bool SymmCommunicator::collective(boundary::Op op, Tensor& out, const Tensor& in) {
  ws_->check(group_);
  if (in.numel() == 0) return true;  // nothing to move (every rank makes the same call)
  if (in.dim() == 0) return false;
  const int64_t rows = in.size(0), row_bytes = in.numel() / rows * in.element_size();
  const Path path =
      collective_path(ws_->layout(), op, rows, row_bytes, in.scalar_type() == at::kBFloat16);
  if (path == Path::kFallback) return false;
  const Tensor src = aligned(in);
  Tensor dst = out.is_contiguous() && aligned16(out) ? out : at::empty_like(out);
  const cudaStream_t stream = current_stream(in);
  {
    const CallOrder::Turn turn = ws_->turn(stream);
    launch_collective(ws_->view(), op, dst, src, -1, path == Path::kLamport, stream);
  }
  if (!dst.is_same(out)) out.copy_(dst);
  return true;
}

Communicator& SymmCommunicator::fallback(const Tensor& in) {
  TORCH_CHECK_VALUE(fallback_ != nullptr, "x: a collective of ", in.scalar_type(), " ",
                    shape_str(in), " does not fit group '", group_,
                    "''s symm buffers, and the group has no NCCL communicator to take it (its "
                    "ranks share a GPU, which NCCL refuses)");
  return *fallback_;
}

void SymmCommunicator::all_gather(Tensor& out, const Tensor& in) {
  if (!collective(boundary::Op::kAllGather, out, in)) fallback(in).all_gather(out, in);
}

void SymmCommunicator::reduce_scatter(Tensor& out, const Tensor& in) {
  if (!collective(boundary::Op::kReduceScatter, out, in)) fallback(in).reduce_scatter(out, in);
}

void SymmCommunicator::all_reduce(Tensor& out, const Tensor& in) {
  if (!collective(boundary::Op::kAllReduce, out, in)) fallback(in).all_reduce(out, in);
}

bool SymmCommunicator::kernels_take(const LayerArgs& a) const {
  const int64_t T = a.in.shape.T, H = a.in.shape.H;
  if (a.num_tokens == 0 || T == 0 || H % 8 != 0) return false;
  if (!a.sharded) return reduction_path(ws_->layout(), T, H, true) == Path::kLamport;
  CallHeader h{};
  h.op = static_cast<uint32_t>(boundary::Op::kFusedLayer);
  h.flags = boundary::kSharded;
  h.rows = h.num_tokens = a.num_tokens;
  h.inner = H;
  h.elem_bytes = 2;
  return exchange_path(ws_->layout(), h) == Path::kExchange;
}

std::optional<LayerOutputs> SymmCommunicator::fused_layer(const LayerArgs& a) {
  if (!kernels_take(a)) return std::nullopt;
  ws_->check(group_);
  const LayerArgs call = aligned_layer_args(a);
  LayerOutputs out = layer_outputs(call);
  const cudaStream_t stream = current_stream(call.partial);
  const CallOrder::Turn turn = ws_->turn(stream);
  launch_fused_layer(ws_->view(), call, out, stream);
  return out;
}

// The entry has no reduction and the head's collapse is small: both are declined, and the op
// composes them from this transport's collectives (the sharded head's reduce-scatter and gather
// run over the buffer).
std::optional<EntryOutputs> SymmCommunicator::fused_entry(const EntryArgs&) { return std::nullopt; }

std::optional<HeadOutputs> SymmCommunicator::fused_head(const HeadArgs&) { return std::nullopt; }

}  // namespace mhc_sp::symm
