// SPDX-License-Identifier: Apache-2.0
// NCCL communicator for CUDA tensors: collectives enqueued on the current CUDA stream, so the
// fused ops never synchronise with the host and can be captured in CUDA graphs.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <cstring>

#include "mhc_sp/comm.h"

namespace mhc_sp {
namespace {

#define MHC_SP_NCCL_CHECK(call)                                                                    \
  do {                                                                                             \
    const ncclResult_t status_ = (call);                                                           \
    TORCH_CHECK(status_ == ncclSuccess, "NCCL error in " #call ": ", ncclGetErrorString(status_)); \
  } while (0)

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
  NcclCommunicator(ncclComm_t comm, int64_t device) : comm_(comm), device_(device) {}
  ~NcclCommunicator() override { ncclCommDestroy(comm_); }

  const char* transport() const override { return "nccl"; }

  void all_gather(Tensor& out, const Tensor& in) override {
    MHC_SP_NCCL_CHECK(ncclAllGather(in.const_data_ptr(), out.data_ptr(), in.numel(), nccl_dtype(in),
                                    comm_, stream()));
  }
  void reduce_scatter(Tensor& out, const Tensor& in) override {
    MHC_SP_NCCL_CHECK(ncclReduceScatter(in.const_data_ptr(), out.data_ptr(), out.numel(),
                                        nccl_dtype(in), ncclSum, comm_, stream()));
  }
  void all_reduce(Tensor& out, const Tensor& in) override {
    MHC_SP_NCCL_CHECK(ncclAllReduce(in.const_data_ptr(), out.data_ptr(), in.numel(), nccl_dtype(in),
                                    ncclSum, comm_, stream()));
  }

 private:
  cudaStream_t stream() const {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
  }
  ncclComm_t comm_;
  int64_t device_;
};

}  // namespace

std::string nccl_unique_id() {
  ncclUniqueId id;
  MHC_SP_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

std::unique_ptr<Communicator> make_nccl_communicator(const std::string& name,
                                                     const std::string& unique_id, int64_t device) {
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

void init_nccl_communicator(const std::string& name, const std::string& unique_id, int64_t device) {
  attach_communicator(name, c10::DeviceType::CUDA, device,
                      make_nccl_communicator(name, unique_id, device));
}

}  // namespace mhc_sp
