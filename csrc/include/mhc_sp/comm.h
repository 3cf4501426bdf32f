#pragma once
// Groups registered with mhc_sp (mhc_sp.distributed.init) and the communicators behind the ops'
// `str group` argument: the group's own gloo backend for CPU tensors (c10d::resolve_process_group),
// an NCCL communicator created by mhc_sp for CUDA tensors (csrc/cuda/nccl_comm.cpp).

#include <ATen/ATen.h>

#include <memory>
#include <string>

namespace mhc_sp {

using at::Tensor;

// Out-of-place collectives over dim 0 of contiguous tensors, summing for the reductions.
class Communicator {
 public:
  virtual ~Communicator() = default;
  // out (world * rows, ...) <- concatenation of every rank's in (rows, ...)
  virtual void all_gather(Tensor& out, const Tensor& in) = 0;
  // out (rows, ...) <- sum over ranks of their in[rank * rows : (rank + 1) * rows]
  virtual void reduce_scatter(Tensor& out, const Tensor& in) = 0;
  // out <- sum over ranks of in (same shape)
  virtual void all_reduce(Tensor& out, const Tensor& in) = 0;
};

// A registered group as seen by one op call: `comm` serves the call's device (null when world == 1).
struct GroupHandle {
  int64_t rank;
  int64_t world;
  Communicator* comm;
};

// Registers `name` (rank, world) and, when world > 1, its gloo/CPU backend. Idempotent.
void register_group(const std::string& name, int64_t rank, int64_t world);
// Attaches a communicator for CUDA tensors on `device` (called by the NCCL setup).
void attach_cuda_communicator(const std::string& name, int64_t device,
                              std::unique_ptr<Communicator> comm);
void unregister_all_groups();
// Rank and world of a registered group (comm left null).
GroupHandle registered_group(const std::string& name);

// The group `name` for a collective on tensor `t` (named `arg` in errors). ValueError when the
// group is unknown to mhc_sp or has no communicator for t's device.
GroupHandle group_for(const std::string& name, const Tensor& t, const char* arg);

#if defined(MHC_SP_WITH_CUDA)
// NCCL setup (csrc/cuda/nccl_comm.cpp): rank 0 makes the id, the group broadcasts it, every rank
// then creates its communicator on `device` and attaches it to the registered group `name`.
std::string nccl_unique_id();
void init_nccl_communicator(const std::string& name, const std::string& unique_id, int64_t device);
// The same communicator, returned instead of attached (the symm transport keeps it as its fallback).
std::unique_ptr<Communicator> make_nccl_communicator(const std::string& name,
                                                    const std::string& unique_id, int64_t device);
#endif

}  // namespace mhc_sp
