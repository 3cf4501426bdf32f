// SPDX-License-Identifier: Apache-2.0
// NCCL communicator for CUDA tensors: collectives enqueued on the current CUDA stream, so the
// fused ops never synchronise with the host and can be captured in CUDA graphs.
//
// Teardown. A communicator is destroyed (ncclCommDestroy) when the registry lets go of it:
// mhc_sp.distributed.destroy(), which also runs at interpreter exit (an atexit hook), or a re-init
// that replaces it; after a failure it is aborted instead (ncclCommAbort), since destroying waits
// for operations that may never finish. Never from the process's C++ exit: once exit() runs its
// handlers, the CUDA runtime may already be gone, and a communicator still alive then (one that
// nothing released) is left to the operating system.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "transport/nccl/transport.h"

namespace mhc_sp {
namespace {

#define MHC_SP_NCCL_CHECK(call)                                                                    \
  do {                                                                                             \
    const ncclResult_t status_ = (call);                                                           \
    TORCH_CHECK(status_ == ncclSuccess, "NCCL error in " #call ": ", ncclGetErrorString(status_)); \
  } while (0)

// Set by a C++ exit handler registered when the first communicator is made, which therefore runs
// before the static destructors of everything loaded until then (the CUDA runtime's included).
std::atomic<bool> process_exiting{false};

void note_process_exit() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit([] { process_exiting.store(true); }); });
}

ncclDataType_t nccl_dtype(const Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default: TORCH_CHECK_TYPE(false, "NCCL collectives do not support dtype ", t.scalar_type());
  }
}

// bf16 reductions are done by NCCL in bf16 (each ring/tree step rounds), unlike the gloo path,
// which widens to fp32: within the design's bf16 tolerance for the tensor-parallel sizes in use.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int64_t device) : comm_(comm), device_(device) {
    note_process_exit();
  }
  ~NcclCommunicator() override { release(); }

  const char* transport() const override { return "nccl"; }

  void all_gather(Tensor& out, const Tensor& in) override {
    checked(ncclAllGather(in.const_data_ptr(), out.data_ptr(), in.numel(), nccl_dtype(in), comm_,
                          stream()),
            "ncclAllGather");
  }
  void reduce_scatter(Tensor& out, const Tensor& in) override {
    checked(ncclReduceScatter(in.const_data_ptr(), out.data_ptr(), out.numel(), nccl_dtype(in),
                              ncclSum, comm_, stream()),
            "ncclReduceScatter");
  }
  void all_reduce(Tensor& out, const Tensor& in) override {
    checked(ncclAllReduce(in.const_data_ptr(), out.data_ptr(), in.numel(), nccl_dtype(in), ncclSum,
                          comm_, stream()),
            "ncclAllReduce");
  }

 private:
  cudaStream_t stream() const {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
  }

  // A failed call leaves the communicator in an unknown state: it is aborted, not destroyed.
  void checked(ncclResult_t status, const char* call) {
    if (status == ncclSuccess) return;
    failed_.store(true);
    TORCH_CHECK(false, "NCCL error in ", call, ": ", ncclGetErrorString(status));
  }

  // Destroy, or abort after a failure (a call of ours failed, NCCL reports an asynchronous error,
  // or the device has a pending CUDA error); nothing at all once the process's C++ exit has begun.
  void release() noexcept {
    if (process_exiting.load()) return;
    ncclResult_t async = ncclSuccess;
    const bool failed = failed_.load() || ncclCommGetAsyncError(comm_, &async) != ncclSuccess ||
                        async != ncclSuccess;
    int current = -1;
    const bool switch_device = cudaGetDevice(&current) == cudaSuccess && current != device_;
    if (switch_device) cudaSetDevice(static_cast<int>(device_));
    const bool cuda_error = cudaPeekAtLastError() != cudaSuccess;
    if (failed || cuda_error) {
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(comm_);
    }
    if (switch_device) cudaSetDevice(current);
  }

  ncclComm_t comm_;
  int64_t device_;
  std::atomic<bool> failed_{false};
};

}  // namespace

std::string nccl::unique_id() {
  ncclUniqueId id;
  MHC_SP_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

std::unique_ptr<Communicator> nccl::make_communicator(const std::string& name,
                                                      const std::string& unique_id,
                                                      int64_t device) {
  ncclUniqueId id;
  TORCH_CHECK_VALUE(unique_id.size() == sizeof(id.internal), "unique_id: expected ",
                    sizeof(id.internal), " bytes, got ", unique_id.size());
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  const GroupHandle g = registered_group(name);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  ncclComm_t comm;
  MHC_SP_NCCL_CHECK(
      ncclCommInitRank(&comm, static_cast<int>(g.world), id, static_cast<int>(g.rank)));
  return std::make_unique<NcclCommunicator>(comm, device);
}

}  // namespace mhc_sp
