// SPDX-License-Identifier: Apache-2.0
// Simulated ranks of a symm group on emulated devices (emulation/world.h), and the group lookup
// the op entries use in the emulation module (in _C, csrc/transport/registry.cpp has it).

#include "emulation/world.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "c10/cuda/CUDAGuard.h"
#include "emulation/internal.h"
#include "transport/symm/communicator.h"
#include "transport/symm/layout.h"

namespace mhc_sp {
namespace {

std::mutex groups_mutex;
std::map<std::string, GroupHandle>& emulated_groups() {
  static auto* groups = new std::map<std::string, GroupHandle>();
  return *groups;
}

}  // namespace

// The emulation module's group_for (mhc_sp/comm.h): emulated groups only, their transport being
// the rank's symm communicator over CPU tensors (the emulated device's memory).
GroupHandle group_for(const std::string& name, const Tensor& t, const char* arg) {
  const std::lock_guard<std::mutex> lock(groups_mutex);
  const auto it = emulated_groups().find(name);
  TORCH_CHECK_VALUE(it != emulated_groups().end(), "group: '", name,
                    "' is not a group of the emulated device");
  TORCH_CHECK_VALUE(t.is_cpu(), arg, ": the emulated device takes CPU tensors, got ", t.device());
  return it->second;
}

namespace emulation {

void register_emulated_group(const std::string& name, GroupHandle handle) {
  const std::lock_guard<std::mutex> lock(groups_mutex);
  emulated_groups()[name] = std::move(handle);
}

void unregister_emulated_group(const std::string& name) {
  GroupHandle gone;
  {
    const std::lock_guard<std::mutex> lock(groups_mutex);
    auto it = emulated_groups().find(name);
    if (it == emulated_groups().end()) return;
    gone = std::move(it->second);
    emulated_groups().erase(it);
  }
}

World::World(int64_t world, int64_t mailbox_slot_bytes, int64_t half_bytes, double timeout_s,
             std::vector<int64_t> devices)
    : devices_(std::move(devices)) {
  static std::atomic<int64_t> next_world{0};
  TORCH_CHECK_VALUE(world >= 1 && world <= symm::kMaxRanks, "world: expected 1 to ",
                    symm::kMaxRanks, " ranks, got ", world);
  if (devices_.empty()) {
    for (int64_t r = 0; r < world; ++r) devices_.push_back(r);
  }
  TORCH_CHECK_VALUE(static_cast<int64_t>(devices_.size()) == world,
                    "devices: expected one device per rank (", world, "), got ", devices_.size());
  for (size_t i = 0; i < devices_.size(); ++i) {
    const int64_t d = devices_[i];
    TORCH_CHECK_VALUE(d >= 0 && d < device_count(), "devices: expected emulated devices in [0, ",
                      device_count(), "), got ", d);
    // One process's symm calls on a device run one at a time (symm::CallOrder), as they do on a
    // GPU; the simulated ranks are one process, so each needs its own device.
    TORCH_CHECK_VALUE(std::count(devices_.begin(), devices_.end(), d) == 1,
                      "devices: every rank needs its own emulated device, got ", d, " twice");
  }
  const symm::BufferLayout L = symm::checked_buffer_layout(world, mailbox_slot_bytes, half_bytes);
  std::vector<int64_t> ptrs;
  const int64_t id = next_world++;
  for (int64_t r = 0; r < world; ++r) {
    buffers_.push_back(at::empty({L.total_bytes}, at::kByte));
    ptrs.push_back(reinterpret_cast<int64_t>(buffers_.back().data_ptr()));
    // Every rank maps every buffer: system memory to the emulated devices (.sys scope, atomic
    // polls).
    add_system_memory(
        buffers_.back().data_ptr(), L.total_bytes,
        "rank " + std::to_string(r) + "'s symm buffer of emulated world " + std::to_string(id));
  }
  for (int64_t r = 0; r < world; ++r) {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(devices_[r]));
    auto ws = std::make_unique<symm::SymmWorkspace>(buffers_[r], ptrs, r, world, mailbox_slot_bytes,
                                                    half_bytes, timeout_s);
    workspaces_.push_back(ws.get());
    groups_.push_back("emulated:" + std::to_string(id) + ":" + std::to_string(r));
    auto comm = std::make_shared<symm::SymmCommunicator>(groups_.back(), std::move(ws), nullptr);
    register_emulated_group(groups_.back(), GroupHandle{r, world, std::move(comm)});
  }
}

World::~World() {
  for (const std::string& g : groups_) unregister_emulated_group(g);
  for (const at::Tensor& b : buffers_) remove_system_memory(b.data_ptr());
}

const symm::SymmWorkspace& World::workspace(int64_t rank) const {
  TORCH_CHECK_VALUE(rank >= 0 && rank < size(), "rank: expected a value in [0, ", size(), "), got ",
                    rank);
  return *workspaces_[rank];
}

namespace {

// Runs fn on one host thread per rank that has calls, each with its device current, and joins.
template <class Fn>
void on_rank_threads(const std::vector<int64_t>& devices, const std::vector<bool>& takes_part,
                     Fn&& fn) {
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < devices.size(); ++r) {
    if (!takes_part[r]) continue;
    ranks.emplace_back([&, r] {
      const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(devices[r]));
      fn(static_cast<int64_t>(r));
    });
  }
  for (std::thread& t : ranks) t.join();
}

// Runs `what` and stores an exception it raises into the outcome; false when it raised.
template <class Fn>
bool caught(World::Outcome& out, Fn&& what) {
  try {
    what();
    return true;
  } catch (const c10::ValueError& e) {
    out.error = e.what_without_backtrace();
    out.value_error = true;
  } catch (const c10::Error& e) {
    out.error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return false;
}

}  // namespace

std::vector<World::Outcome> World::run(const std::vector<std::vector<Call>>& calls,
                                       const std::vector<double>& delays_s,
                                       const std::vector<int64_t>& pauses_us) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(calls.size()) == size(),
                    "calls: expected one list per rank (", size(), "), got ", calls.size());
  TORCH_CHECK_VALUE(delays_s.empty() || static_cast<int64_t>(delays_s.size()) == size(),
                    "delays: expected none or one per rank");
  TORCH_CHECK_VALUE(pauses_us.empty() || static_cast<int64_t>(pauses_us.size()) == size(),
                    "pauses_us: expected none or one per rank");
  std::vector<Outcome> out(calls.size());
  std::vector<bool> takes_part;
  for (const auto& c : calls) takes_part.push_back(!c.empty());
  const int64_t default_pause = config().delays ? 255 : 0;
  spans_.assign(calls.size(), {});
  on_rank_threads(devices_, takes_part, [&](int64_t r) {
    if (!delays_s.empty() && delays_s[r] > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(delays_s[r]));
    }
    const int64_t pause = pauses_us.empty() ? default_pause : pauses_us[r];
    for (size_t k = 0; k < calls[r].size(); ++k) {
      if (pause > 0) {  // seeded per rank and call: the ranks drift apart and back
        const uint64_t us = host_draw(uint64_t(r) << 32 | k) % uint64_t(pause + 1);
        std::this_thread::sleep_for(std::chrono::microseconds(us));
      }
      std::vector<at::Tensor> got;
      const uint64_t start = detail::now_ns();
      if (!caught(out[r], [&] { got = calls[r][k](groups_[r]); })) return;
      spans_[r].emplace_back(start, detail::now_ns());
      out[r].outputs.push_back(std::move(got));
    }
    const std::string failed = synchronize(static_cast<int>(devices_[r]));
    if (!failed.empty()) out[r].error = failed;
  });
  return out;
}

std::vector<std::shared_ptr<Graph>> World::capture(const std::vector<std::vector<Call>>& calls,
                                                   std::vector<Outcome>& outcomes) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(calls.size()) == size(),
                    "calls: expected one list per rank (", size(), "), got ", calls.size());
  std::vector<std::shared_ptr<Graph>> graphs(calls.size());
  outcomes.assign(calls.size(), Outcome{});
  std::vector<bool> takes_part(calls.size(), true);
  on_rank_threads(devices_, takes_part, [&](int64_t r) {
    const int device = static_cast<int>(devices_[r]);
    begin_capture(device);
    for (const Call& c : calls[r]) {
      std::vector<at::Tensor> got;
      if (!caught(outcomes[r], [&] { got = c(groups_[r]); })) break;
      outcomes[r].outputs.push_back(std::move(got));
    }
    graphs[r] = end_capture(device);
  });
  return graphs;
}

std::vector<std::string> World::replay(const std::vector<std::shared_ptr<Graph>>& graphs) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(graphs.size()) == size(),
                    "graphs: expected one per rank (", size(), "), got ", graphs.size());
  std::vector<std::string> errors(graphs.size());
  std::vector<bool> takes_part(graphs.size(), true);
  on_rank_threads(devices_, takes_part, [&](int64_t r) {
    Outcome out;
    if (!caught(out, [&] { emulation::replay(graphs[r]); })) errors[r] = out.error;
  });
  return errors;
}

}  // namespace emulation
}  // namespace mhc_sp
