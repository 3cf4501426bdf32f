// SPDX-License-Identifier: Apache-2.0
// One rank's symm workspace (transport/symm/workspace.h). The buffer comes from torch symmetric
// memory at mhc_sp.distributed.init (python/mhc_sp/transports/symm.py), or, in the testing module,
// from plain device memory of one GPU shared by simulated ranks.

#include "transport/symm/workspace.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <cstring>
#include <map>

namespace mhc_sp::symm {
namespace {

cudaStream_t current_stream(const Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// Whether `t` is memory the kernels can use: a CUDA tensor (on the emulated device,
// csrc/emulation/, whose memory is host memory: a CPU tensor).
bool device_memory(const Tensor& t) {
#if defined(MHC_SP_EMULATION)
  return t.is_cpu();
#else
  return t.is_cuda();
#endif
}

}  // namespace

CallOrder::CallOrder(int device) {
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&last_, cudaEventDisableTiming));
}

CallOrder& CallOrder::of_device(int device) {
  static std::mutex made_mutex;
  static auto* made = new std::map<int, CallOrder*>();  // never destroyed (see the header)
  const std::lock_guard<std::mutex> lock(made_mutex);
  CallOrder*& order = (*made)[device];
  if (order == nullptr) order = new CallOrder(device);
  return *order;
}

void CallOrder::synchronize() {
  const std::lock_guard<std::mutex> lock(mutex_);
  (void)cudaEventSynchronize(last_);  // teardown: errors are ignored
}

CallOrder::Turn::Turn(CallOrder& order, cudaStream_t stream)
    : lock_(order.mutex_), order_(order), stream_(stream), captured_(false) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  captured_ = status != cudaStreamCaptureStatusNone;
  // An event never recorded is complete: the device's first call waits for nothing.
  C10_CUDA_CHECK(cudaStreamWaitEvent(stream, order_.last_,
                                     captured_ ? cudaEventWaitExternal : cudaEventWaitDefault));
}

CallOrder::Turn::~Turn() {
  // Teardown of a turn whose launch threw still records, so that the order stays whole; an error
  // here cannot be raised from a destructor and would show on the next call.
  (void)cudaEventRecordWithFlags(order_.last_, stream_,
                                 captured_ ? cudaEventRecordExternal : cudaEventRecordDefault);
}

SymmWorkspace::SymmWorkspace(Tensor buffer, const std::vector<int64_t>& peer_ptrs, int64_t rank,
                             int64_t world, int64_t mailbox_slot_bytes, int64_t half_bytes,
                             double timeout_s, std::shared_ptr<const void> mapping)
    : mapping_(std::move(mapping)),
      buffer_(std::move(buffer)),
      rank_(rank),
      world_(world),
      layout_(buffer_layout(world, mailbox_slot_bytes, half_bytes)),
      timeout_s_(timeout_s) {
  TORCH_CHECK_VALUE(
      device_memory(buffer_) && buffer_.scalar_type() == at::kByte && buffer_.is_contiguous(),
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
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  order_ = &CallOrder::of_device(device);
  // Peers may push as soon as they return from init: everything above must be in memory first
  // (the caller then runs a host barrier over the group).
  C10_CUDA_CHECK(cudaStreamSynchronize(current_stream(buffer_)));
}

SymmWorkspace::~SymmWorkspace() {
  // The last call may still run and use the peers' mappings and this rank's state: wait for the
  // device's order to pass it before anything is released (errors are ignored, this is teardown).
  // A captured graph must not be replayed after its group's workspace is gone.
  if (order_ != nullptr) order_->synchronize();
  if (error_host_ != nullptr) cudaFreeHost(const_cast<ErrorRecord*>(error_host_));
}

RankView SymmWorkspace::view() const {
  return RankView{reinterpret_cast<uint8_t* const*>(peers_.data_ptr()),
                  static_cast<int>(rank_),
                  static_cast<int>(world_),
                  reinterpret_cast<LocalState*>(state_.data_ptr()),
                  error_dev_,
                  static_cast<uint64_t>(timeout_s_ * 1e9),
                  layout_};
}

LocalState SymmWorkspace::local_state() const {
  const Tensor host = state_.to(at::kCPU);  // a blocking copy on a GPU
  LocalState s{};
  std::memcpy(&s, host.data_ptr(), sizeof(LocalState));
  return s;
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

}  // namespace mhc_sp::symm
