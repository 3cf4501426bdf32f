// SPDX-License-Identifier: Apache-2.0
// The registry of groups initialised with mhc_sp and the transport each serves per device.

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <map>
#include <mutex>

#include "mhc_sp/comm.h"
#include "transport/gloo/transport.h"

namespace mhc_sp {
namespace {

struct GroupEntry {
  int64_t rank = 0;
  int64_t world = 1;
  std::shared_ptr<Communicator> cpu;
  std::shared_ptr<Communicator> cuda;
  int64_t cuda_device = -1;
};

std::mutex registry_mutex;
// Never destroyed: at the process's C++ exit the CUDA runtime may already be gone, and destroying
// an NCCL communicator then can hang or crash. mhc_sp.distributed.destroy() frees everything while
// it is safe, called by the user or by its hook at interpreter exit, through
// unregister_all_groups().
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
  std::shared_ptr<Communicator> cpu;
  if (world > 1) {
    c10::intrusive_ptr<c10d::ProcessGroup> pg;
    try {
      pg = c10d::resolve_process_group(name);
    } catch (const std::exception&) {
      TORCH_CHECK_VALUE(false, "group: unknown torch.distributed group '", name, "'");
    }
    TORCH_CHECK_VALUE(pg->getSize() == world && pg->getRank() == rank, "group: '", name,
                      "' has rank ", pg->getRank(), " of ", pg->getSize(), ", not ", rank, " of ",
                      world);
    try {
      cpu = gloo::make_communicator(name);
    } catch (const c10::ValueError&) {
      // No CPU backend (e.g. an NCCL-only group): CPU tensors on it are refused in group_for.
    }
  }
  // Replaced transports are released after the lock: the last reference may be an op's, and a
  // transport's teardown (waiting for its kernels, releasing a Python handle) must not hold it.
  std::shared_ptr<Communicator> old_cuda;  // after the swap below, `cpu` holds the old one
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto& entry = registry()[name];
    const bool same = entry.world == world && entry.rank == rank;
    entry.rank = rank;
    entry.world = world;
    if (!same || !entry.cpu) std::swap(entry.cpu, cpu);
    if (!same) std::swap(entry.cuda, old_cuda);
  }
}

void attach_communicator(const std::string& name, c10::DeviceType device_type, int64_t device_index,
                         std::shared_ptr<Communicator> comm) {
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto& entry = lookup(name);
    if (device_type == c10::DeviceType::CUDA) {
      std::swap(entry.cuda, comm);
      entry.cuda_device = device_index;
    } else {
      std::swap(entry.cpu, comm);
    }
  }
  // `comm` now holds the replaced transport (if any): released here, outside the lock.
}

void unregister_all_groups() {
  std::map<std::string, GroupEntry> groups;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    std::swap(groups, registry());
  }
  // Each transport goes once the last op holding it is done (usually here, outside the lock).
}

GroupHandle registered_group(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  const auto& entry = lookup(name);
  return {entry.rank, entry.world, nullptr};
}

std::string group_transport(const std::string& name, c10::DeviceType device_type) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  const auto& entry = lookup(name);
  if (entry.world == 1) return "local";
  const auto& comm = device_type == c10::DeviceType::CUDA ? entry.cuda : entry.cpu;
  return comm ? comm->transport() : "";
}

GroupHandle group_for(const std::string& name, const Tensor& t, const char* arg) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& entry = lookup(name);
  if (entry.world == 1) return {0, 1, nullptr};
  if (t.is_cuda()) {
    TORCH_CHECK_VALUE(entry.cuda, arg, ": group '", name, "' has no CUDA transport for ",
                      t.device(),
                      "; call mhc_sp.distributed.init(group, device='cuda') on every rank");
    TORCH_CHECK_VALUE(entry.cuda_device == t.device().index(), arg,
                      ": expected a tensor on cuda:", entry.cuda_device, " (the device of group '",
                      name, "''s ", entry.cuda->transport(), " transport), got ", t.device());
    return {entry.rank, entry.world, entry.cuda};
  }
  TORCH_CHECK_VALUE(t.is_cpu(), arg, ": group '", name, "' cannot serve tensors on ", t.device());
  TORCH_CHECK_VALUE(entry.cpu, arg, ": group '", name,
                    "' has no CPU transport for cpu tensors; create it with backend 'gloo' or "
                    "'cpu:gloo,cuda:nccl', or call mhc_sp.distributed.init(group, device='cpu')");
  return {entry.rank, entry.world, entry.cpu};
}

}  // namespace mhc_sp
