// Group registry and the gloo communicator (CPU tensors).

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <map>
#include <mutex>

#include "mhc_sp/comm.h"

namespace mhc_sp {
namespace {

// torch renamed _allgather_base/_reduce_scatter_base to all_gather_single/reduce_scatter_single
// (2.14 keeps the old names as deprecated aliases; 2.11 on the GPU image has only the old ones).
template <typename PG>
c10::intrusive_ptr<c10d::Work> pg_all_gather(PG& pg, Tensor& out, Tensor& in) {
  if constexpr (requires { pg.all_gather_single(out, in); }) {
    return pg.all_gather_single(out, in);
  } else {
    return pg._allgather_base(out, in);
  }
}

template <typename PG>
c10::intrusive_ptr<c10d::Work> pg_reduce_scatter(PG& pg, Tensor& out, Tensor& in) {
  if constexpr (requires { pg.reduce_scatter_single(out, in); }) {
    return pg.reduce_scatter_single(out, in);
  } else {
    return pg._reduce_scatter_base(out, in);
  }
}

// Runs the group's own CPU backend (gloo) and waits: gloo work completes on its own threads.
// Reductions of bf16/fp16 are done in fp32 (gloo would otherwise round at every step).
class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroup> pg) : pg_(std::move(pg)) {}

  void all_gather(Tensor& out, const Tensor& in) override {
    Tensor src = in;
    pg_all_gather(*pg_, out, src)->wait();
  }

  void reduce_scatter(Tensor& out, const Tensor& in) override {
    Tensor src = widen(in);
    Tensor dst = out.scalar_type() == src.scalar_type() ? out : at::empty(out.sizes(), src.options());
    pg_reduce_scatter(*pg_, dst, src)->wait();
    if (!dst.is_same(out)) out.copy_(dst);
  }

  void all_reduce(Tensor& out, const Tensor& in) override {
    std::vector<Tensor> buf{widen(in).clone()};
    pg_->allreduce(buf)->wait();
    out.copy_(buf[0]);
  }

 private:
  static Tensor widen(const Tensor& t) {
    return at::isReducedFloatingType(t.scalar_type()) ? t.to(at::kFloat) : t;
  }
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
};

struct GroupEntry {
  int64_t rank = 0;
  int64_t world = 1;
  std::unique_ptr<Communicator> cpu;
  std::unique_ptr<Communicator> cuda;
  int64_t cuda_device = -1;
};

std::mutex registry_mutex;
// Never destroyed: at interpreter exit the CUDA runtime may already be gone, and destroying an
// NCCL communicator then can crash. mhc_sp.distributed.destroy() frees everything while it is safe.
std::map<std::string, GroupEntry>& registry() {
  static auto* groups = new std::map<std::string, GroupEntry>();
  return *groups;
}

GroupEntry& lookup(const std::string& name) {
  auto& groups = registry();
  auto it = groups.find(name);
  TORCH_CHECK_VALUE(it != groups.end(), "group: '", name,
                    "' is not initialised with mhc_sp; call mhc_sp.distributed.init(group) first");
  return it->second;
}

}  // namespace

void register_group(const std::string& name, int64_t rank, int64_t world) {
  TORCH_CHECK_VALUE(world >= 1 && rank >= 0 && rank < world, "group: invalid rank ", rank,
                    " for world size ", world);
  std::unique_ptr<Communicator> cpu;
  if (world > 1) {
    c10::intrusive_ptr<c10d::ProcessGroup> pg;
    try {
      pg = c10d::resolve_process_group(name);
    } catch (const std::exception& e) {
      TORCH_CHECK_VALUE(false, "group: unknown torch.distributed group '", name, "'");
    }
    TORCH_CHECK_VALUE(pg->getSize() == world && pg->getRank() == rank, "group: '", name,
                      "' has rank ", pg->getRank(), " of ", pg->getSize(), ", not ", rank, " of ", world);
    try {
      pg->getBackend(c10::DeviceType::CPU);
      cpu = std::make_unique<GlooCommunicator>(pg);
    } catch (const std::exception&) {
      // No CPU backend (e.g. an NCCL-only group): CPU tensors on it are refused in group_for.
    }
  }
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& entry = registry()[name];
  const bool same = entry.world == world && entry.rank == rank;
  entry.rank = rank;
  entry.world = world;
  if (!same || !entry.cpu) entry.cpu = std::move(cpu);
  if (!same) entry.cuda.reset();
}

void attach_cuda_communicator(const std::string& name, int64_t device,
                              std::unique_ptr<Communicator> comm) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& entry = lookup(name);
  entry.cuda = std::move(comm);
  entry.cuda_device = device;
}

void unregister_all_groups() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().clear();
}

GroupHandle registered_group(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  const auto& entry = lookup(name);
  return {entry.rank, entry.world, nullptr};
}

GroupHandle group_for(const std::string& name, const Tensor& t, const char* arg) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& entry = lookup(name);
  if (entry.world == 1) return {0, 1, nullptr};
  if (t.is_cuda()) {
    TORCH_CHECK_VALUE(entry.cuda, arg, ": group '", name, "' has no NCCL communicator for ", t.device(),
                      "; call mhc_sp.distributed.init(group, device='cuda') on every rank");
    TORCH_CHECK_VALUE(entry.cuda_device == t.device().index(), arg, ": expected a tensor on cuda:",
                      entry.cuda_device, " (the device of group '", name, "'s NCCL communicator), got ",
                      t.device());
    return {entry.rank, entry.world, entry.cuda.get()};
  }
  TORCH_CHECK_VALUE(t.is_cpu(), arg, ": group '", name, "' cannot serve tensors on ", t.device());
  TORCH_CHECK_VALUE(entry.cpu, arg, ": group '", name,
                    "' has no CPU (gloo) backend for cpu tensors; create it with backend 'gloo' or "
                    "'cpu:gloo,cuda:nccl'");
  return {entry.rank, entry.world, entry.cpu.get()};
}

}  // namespace mhc_sp
