// SPDX-License-Identifier: Apache-2.0
// The symm transport for CUDA tensors: a rank's workspace over its symmetric-memory buffer (the
// peer buffers come from torch symmetric memory at mhc_sp.distributed.init, see
// python/mhc_sp/_symm.py), the communicator the ops call, and the single-GPU harness that runs
// several simulated ranks through the same kernels. Calls that do not fit the workspace (or a
// dtype the kernels do not reduce) go to the group's NCCL communicator, which the transport keeps.

#include "mhc_sp/cuda/symm_comm.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstring>

#include "mhc_sp/checks.h"
#include "mhc_sp/cuda/symm_launch.h"

namespace mhc_sp::symm {
namespace {

cudaStream_t current_stream(const Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

bool aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

// The kernels move 16-byte vectors: a misaligned view is copied (the path a call takes never
// depends on addresses, which may differ between ranks, only on shapes).
Tensor aligned(const Tensor& t) {
  return t.is_contiguous() && aligned16(t) ? t : t.clone(at::MemoryFormat::Contiguous);
}

PreParams layer_pre_params(const LayerTensors& in, int64_t T, const MhcScalars& s,
                           const Tensor& post_out, const Tensor& comb_out, BFloat16* layer_input) {
  const int64_t n = in.residual.size(1), H = in.residual.size(2);
  return PreParams{T,
                   n,
                   H,
                   n * (n + 2),
                   in.fn.const_data_ptr<float>(),
                   in.hc_scale.const_data_ptr<float>(),
                   in.hc_base.const_data_ptr<float>(),
                   in.norm_weight ? in.norm_weight->const_data_ptr<float>() : nullptr,
                   s,
                   post_out.data_ptr<float>(),
                   comb_out.data_ptr<float>(),
                   layer_input};
}

}  // namespace

SymmWorkspace::SymmWorkspace(Tensor buffer, const std::vector<int64_t>& peer_ptrs, int64_t rank,
                             int64_t world, int64_t mailbox_slot_bytes, int64_t half_bytes,
                             double timeout_s)
    : buffer_(std::move(buffer)),
      rank_(rank),
      world_(world),
      layout_(buffer_layout(world, mailbox_slot_bytes, half_bytes)),
      timeout_s_(timeout_s) {
  TORCH_CHECK_VALUE(
      buffer_.is_cuda() && buffer_.scalar_type() == at::kByte && buffer_.is_contiguous(),
      "buffer: expected a contiguous uint8 CUDA tensor");
  TORCH_CHECK_VALUE(buffer_.numel() >= layout_.total_bytes, "buffer: expected at least ",
                    layout_.total_bytes, " bytes for world ", world, ", got ", buffer_.numel());
  TORCH_CHECK_VALUE(timeout_s > 0, "timeout: expected a positive number of seconds, got ",
                    timeout_s);
  const std::vector<int64_t> table =
      checked_peer_table(peer_ptrs, rank, world, reinterpret_cast<int64_t>(buffer_.data_ptr()));
  const c10::cuda::CUDAGuard guard(buffer_.device());
  const auto opts = buffer_.options();
  peers_ = at::tensor(table, at::kLong).to(buffer_.device());
  state_ = at::zeros({static_cast<int64_t>(sizeof(LocalState))}, opts);
  void* record = nullptr;
  C10_CUDA_CHECK(cudaHostAlloc(&record, sizeof(ErrorRecord), cudaHostAllocMapped));
  std::memset(record, 0, sizeof(ErrorRecord));
  error_host_ = static_cast<ErrorRecord*>(record);
  C10_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_dev_), record, 0));
  // This rank's own buffer: zero flags (epoch 0), every mailbox armed (-0), then the header.
  buffer_.narrow(0, 0, layout_.total_bytes).zero_();
  buffer_.narrow(0, layout_.mailbox_offset, kMailboxes * world * layout_.mailbox_slot_bytes)
      .view(at::kShort)
      .fill_(static_cast<int16_t>(kNegZeroBits));
  boundary::SegmentHeader header{};
  header.magic = boundary::kMagic;
  header.version = boundary::kVersion;
  header.world = static_cast<uint32_t>(world);
  header.half_bytes = static_cast<uint64_t>(layout_.half_bytes);
  header.total_bytes = static_cast<uint64_t>(layout_.total_bytes);
  Tensor host = at::empty({static_cast<int64_t>(sizeof(header))}, at::kByte);
  std::memcpy(host.data_ptr(), &header, sizeof(header));
  buffer_.narrow(0, 0, sizeof(header)).copy_(host);
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&eager_done_, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&capture_done_, cudaEventDisableTiming));
  // Peers may push as soon as they return from init: everything above must be in memory first
  // (the caller then runs a host barrier over the group).
  C10_CUDA_CHECK(cudaStreamSynchronize(current_stream(buffer_)));
}

SymmWorkspace::~SymmWorkspace() {
  if (eager_done_ != nullptr) cudaEventDestroy(eager_done_);
  if (capture_done_ != nullptr) cudaEventDestroy(capture_done_);
  if (error_host_ != nullptr) cudaFreeHost(const_cast<ErrorRecord*>(error_host_));
}

void SymmWorkspace::order_call(cudaStream_t stream) const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id));
  const uint64_t capture = status == cudaStreamCaptureStatusNone ? 0 : uint64_t(id) + 1;
  const StreamChain::Step step = chain_.next(reinterpret_cast<uint64_t>(stream), capture);
  pending_ = step.captured ? capture_done_ : eager_done_;
  if (step.wait) C10_CUDA_CHECK(cudaStreamWaitEvent(stream, pending_, 0));
}

void SymmWorkspace::call_enqueued(cudaStream_t stream) const {
  C10_CUDA_CHECK(cudaEventRecord(pending_, stream));
}

RankHandles SymmWorkspace::handles(bool absent) const {
  return RankHandles{reinterpret_cast<uint8_t* const*>(peers_.data_ptr()),
                     static_cast<int>(rank_),
                     static_cast<int>(world_),
                     reinterpret_cast<LocalState*>(state_.data_ptr()),
                     error_dev_,
                     static_cast<uint64_t>(timeout_s_ * 1e9),
                     layout_,
                     absent ? 1 : 0};
}

ErrorRecord SymmWorkspace::error() const {
  ErrorRecord e{};
  e.code = error_host_->code;
  if (e.code == kNoError) return e;
  std::atomic_thread_fence(std::memory_order_acquire);  // the device wrote the fields first
  e.rank = error_host_->rank;
  e.peer = error_host_->peer;
  e.block = error_host_->block;
  e.op = error_host_->op;
  e.phase = error_host_->phase;
  e.epoch = error_host_->epoch;
  e.waited_ns = error_host_->waited_ns;
  return e;
}

void SymmWorkspace::check(const std::string& group) const {
  const ErrorRecord e = error();
  TORCH_CHECK(e.code == kNoError, "mhc_sp: ", describe_error(e, group, timeout_s_));
}

// ---- shared by production and the harness
// ----------------------------------------------------------

bool run_collective(const std::vector<const SymmWorkspace*>& ranks, boundary::Op op,
                    const std::vector<Tensor>& outs, const std::vector<Tensor>& ins,
                    int64_t num_tokens, bool simulated, int64_t absent) {
  const Tensor& in0 = ins[0];
  if (in0.numel() == 0 || in0.dim() == 0) return false;
  const int64_t rows = in0.size(0), row_bytes = in0.numel() / rows * in0.element_size();
  if (op != boundary::Op::kAllGather && in0.scalar_type() != at::kBFloat16) return false;
  const BufferLayout& L = ranks[0]->layout();
  CallHeader h{};
  h.op = static_cast<uint32_t>(op);
  h.rows = rows;
  h.num_tokens = num_tokens;
  h.inner = row_bytes;
  h.elem_bytes = 1;
  const bool lamport =
      op == boundary::Op::kAllReduce && reduction_path(L, 1, in0.numel(), false) == Path::kLamport;
  if (!lamport && exchange_path(L, h) != Path::kExchange) return false;
  std::vector<CollectiveCall> calls;
  std::vector<Tensor> keep;
  std::vector<std::pair<Tensor, Tensor>> copy_back;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const Tensor src = aligned(ins[i]);
    Tensor dst = outs[i].is_contiguous() && aligned16(outs[i]) ? outs[i] : at::empty_like(outs[i]);
    if (!dst.is_same(outs[i])) copy_back.emplace_back(dst, outs[i]);
    keep.push_back(src);
    calls.push_back(CollectiveCall{ranks[i]->handles(static_cast<int64_t>(i) == absent), op,
                                   src.const_data_ptr(), dst.data_ptr(), rows, row_bytes,
                                   num_tokens});
  }
  const cudaStream_t stream = current_stream(in0);
  for (const SymmWorkspace* ws : ranks) ws->order_call(stream);
  launch_collective(calls, lamport, simulated, stream);
  for (const SymmWorkspace* ws : ranks) ws->call_enqueued(stream);
  for (auto& [from, to] : copy_back) to.copy_(from);
  return true;
}

std::vector<LayerOutputs> run_fused_layer(const std::vector<const SymmWorkspace*>& ranks,
                                          const std::vector<LayerTensors>& inputs,
                                          const MhcScalars& s, bool sharded, int64_t num_tokens,
                                          bool simulated, int64_t absent) {
  std::vector<LayerCall> calls;
  std::vector<LayerOutputs> outs;
  std::vector<Tensor> keep;  // aligned copies, alive until the launch is enqueued
  for (size_t i = 0; i < ranks.size(); ++i) {
    const LayerTensors& in = inputs[i];
    const int64_t T = in.residual.size(0), n = in.residual.size(1), H = in.residual.size(2);
    const auto opts = in.residual.options();
    Tensor residual_out = at::empty({T, n, H}, opts);
    Tensor post_out = at::empty({T, n}, opts.dtype(at::kFloat));
    Tensor comb_out = at::empty({T, n, n}, opts.dtype(at::kFloat));
    Tensor layer_input = at::empty({sharded ? num_tokens : T, H}, opts);
    const Tensor partial = aligned(in.partial), residual = aligned(in.residual);
    keep.push_back(partial);
    keep.push_back(residual);
    LayerCall c{};
    c.h = ranks[i]->handles(static_cast<int64_t>(i) == absent);
    c.partial = partial.const_data_ptr<BFloat16>();
    c.post = PostParams{T,
                        n,
                        H,
                        nullptr,
                        residual.const_data_ptr<BFloat16>(),
                        in.post.const_data_ptr<float>(),
                        in.comb.const_data_ptr<float>(),
                        residual_out.data_ptr<BFloat16>()};
    c.pre = layer_pre_params(in, T, s, post_out, comb_out,
                             sharded ? nullptr : layer_input.data_ptr<BFloat16>());
    c.gathered = sharded ? layer_input.data_ptr<BFloat16>() : nullptr;
    c.num_tokens = num_tokens;
    calls.push_back(c);
    outs.emplace_back(residual_out, post_out, comb_out, layer_input);
  }
  const cudaStream_t stream = current_stream(inputs[0].residual);
  for (const SymmWorkspace* ws : ranks) ws->order_call(stream);
  if (sharded) {
    launch_sharded_layer(calls, simulated, stream);
  } else {
    launch_lamport_layer(calls, simulated, stream);
  }
  for (const SymmWorkspace* ws : ranks) ws->call_enqueued(stream);
  return outs;
}

// ---- production communicator
// ---------------------------------------------------------------------

SymmCommunicator::SymmCommunicator(std::string group, std::unique_ptr<SymmWorkspace> workspace,
                                   std::unique_ptr<Communicator> fallback)
    : group_(std::move(group)), ws_(std::move(workspace)), fallback_(std::move(fallback)) {}

bool SymmCommunicator::collective(boundary::Op op, Tensor& out, const Tensor& in) {
  ws_->check(group_);
  if (in.numel() == 0) return true;  // nothing to move (every rank makes the same call)
  return run_collective({ws_.get()}, op, {out}, {in}, -1, false, -1);
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
  const int64_t T = a.stream.T, H = a.stream.H;
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

LayerOutputs SymmCommunicator::fused_layer(const LayerArgs& a) {
  if (!kernels_take(a)) return composed_fused_layer(a, handle());
  ws_->check(group_);
  const LayerTensors in{a.partial, a.residual, a.post,    a.comb,
                        a.fn,      a.hc_scale, a.hc_base, a.norm_weight};
  return run_fused_layer({ws_.get()}, {in}, a.s, a.sharded, a.num_tokens, false, -1)[0];
}

// The entry has no reduction and the head's collapse is small: both compose this transport's
// collectives (the sharded head's reduce-scatter and gather run over the buffer).
EntryOutputs SymmCommunicator::fused_entry(const EntryArgs& a) {
  return composed_fused_entry(a, handle());
}

HeadOutputs SymmCommunicator::fused_head(const HeadArgs& a) {
  return composed_fused_head(a, handle());
}

// ---- the single-GPU harness
// ------------------------------------------------------------------------

SymmSimGroup::SymmSimGroup(int64_t world, int64_t device, int64_t mailbox_slot_bytes,
                           int64_t half_bytes, double timeout_s) {
  TORCH_CHECK_VALUE(world >= 1 && world <= kMaxSimRanks, "world: the harness simulates 1 to ",
                    kMaxSimRanks, " ranks, got ", world);
  const int64_t devices = c10::cuda::device_count();
  TORCH_CHECK_VALUE(device >= 0 && device < devices, "device: expected a CUDA device index in [0, ",
                    devices, "), got ", device);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));  // events, streams
  const BufferLayout L = buffer_layout(world, mailbox_slot_bytes, half_bytes);
  const auto opts = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device);
  std::vector<int64_t> ptrs;
  for (int64_t r = 0; r < world; ++r) {
    buffers_.push_back(at::empty({L.total_bytes}, opts));
    ptrs.push_back(reinterpret_cast<int64_t>(buffers_.back().data_ptr()));
  }
  for (int64_t r = 0; r < world; ++r) {
    ranks_.push_back(std::make_unique<SymmWorkspace>(buffers_[r], ptrs, r, world,
                                                     mailbox_slot_bytes, half_bytes, timeout_s));
  }
}

std::vector<const SymmWorkspace*> SymmSimGroup::ranks() const {
  std::vector<const SymmWorkspace*> out;
  for (const auto& r : ranks_) out.push_back(r.get());
  return out;
}

const SymmWorkspace& SymmSimGroup::rank(int64_t r) const {
  TORCH_CHECK_VALUE(r >= 0 && r < world(), "rank: expected a value in [0, ", world(), "), got ", r);
  return *ranks_[r];
}

}  // namespace mhc_sp::symm
