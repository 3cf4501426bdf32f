// SPDX-License-Identifier: Apache-2.0
// The emulated devices and their streams (emulation/device.h): configuration, resident-block
// slots, launches (blocks on OS threads; programmatic dependent launch with the primary's blocks
// still running), stream capture and replay, events, the runtime API subset of the shim
// (shim/cuda_runtime.h) and the device allocator.
//
// A stream runs on its host thread: a launch returns once its grid has completed, so host code
// after it (tensor operations on the outputs) sees its results, as the stream order of a GPU
// would give them. The one exception is what programmatic dependent launch is for: a grid whose
// blocks execute griddepcontrol.launch_dependents returns once all of them have (or have
// exited), still running, so that the host can launch its dependent beside it; that dependent's
// griddepcontrol.wait then waits for it, and the next operation on the stream for both.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "c10/cuda/CUDACachingAllocator.h"
#include "c10/cuda/CUDAStream.h"
#include "cuda_runtime.h"
#include "emulation/internal.h"

struct CUstream_st {
  int device;
};

struct CUevent_st {
  uint64_t id;
};

namespace mhc_sp::emulation {

namespace detail {

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

std::string site(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

void Launch::fail(const std::string& what) {
  {
    const std::lock_guard<std::mutex> lock(m);
    if (failure.empty()) failure = what;
  }
  aborted = true;
}

void Launch::mark_block_released() {
  if (blocks_released.fetch_add(1) + 1 == uint64_t(grid.x) * grid.y) {
    const std::lock_guard<std::mutex> lock(m);
    dependents_released = true;
    cv.notify_all();
  }
}

namespace {

constexpr int kMaxDevices = 16;

struct Device {
  std::mutex m;
  std::condition_variable cv;
  int sms = 0, blocks_per_sm = 0;  // this device's size (configure, configure_device)
  int lag_us = 0;                  // a lagging rank's stall (configure_device)
  int free_slots = 0;              // resident-block slots left
  int free_dependent_slots = 0;    // a programmatic dependent's blocks sit beside its primary's
  int running_launches = 0;
  uint64_t launch_count = 0;
  // Launches on the stream still running (a primary that let the host go on, its dependent).
  std::vector<std::shared_ptr<Launch>> in_flight;
  std::shared_ptr<Graph> capture;  // non-null while the stream is capturing
  std::string sticky;              // a failure nobody was told of yet (a free drained it)
};

std::mutex config_mutex;
DeviceConfig device_config;
Device devices[kMaxDevices];
CUstream_st streams[kMaxDevices];
std::mutex log_mutex;
std::vector<LaunchRecord> launch_log;
std::vector<size_t> open_records;  // per launch id on the log: its index (end time filled later)
std::vector<EventRecord> event_log;
std::atomic<uint64_t> next_event{1};

struct DeviceInit {
  DeviceInit() {
    for (int d = 0; d < kMaxDevices; ++d) {
      streams[d].device = d;
      devices[d].sms = device_config.sms;
      devices[d].blocks_per_sm = device_config.blocks_per_sm;
      devices[d].free_slots = devices[d].free_dependent_slots =
          device_config.sms * device_config.blocks_per_sm;
    }
  }
} device_init;

thread_local int host_device = 0;  // the calling host thread's current device
thread_local std::string last_error;

int capacity(const Device& d) { return d.sms * d.blocks_per_sm; }

int& slot_pool(Device& d, bool dependent) {
  return dependent ? d.free_dependent_slots : d.free_slots;
}

void acquire_slots(Device& d, bool dependent, int n) {
  std::unique_lock<std::mutex> lock(d.m);
  d.cv.wait(lock, [&] { return slot_pool(d, dependent) >= n; });
  slot_pool(d, dependent) -= n;
}

void release_slots(Device& d, bool dependent, int n) {
  {
    const std::lock_guard<std::mutex> lock(d.m);
    slot_pool(d, dependent) += n;
  }
  d.cv.notify_all();
}

uint64_t mix(uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// The launch's worker threads: each runs blocks within the device's slots until none is left.
struct Running {
  std::shared_ptr<Launch> launch;
  std::vector<std::thread> workers;
  size_t record = 0;  // its index in launch_log
};

std::mutex running_mutex;
std::vector<Running> running;  // every launch started and not yet waited for

void start_workers(Device& d, const std::shared_ptr<Launch>& L, int workers, size_t record) {
  const bool dependent = L->primary != nullptr;
  const uint64_t total = uint64_t(L->grid.x) * L->grid.y;
  Running r{L, {}, record};
  L->workers_left = workers;
  if (L->cooperative) acquire_slots(d, dependent, static_cast<int>(total));
  for (int w = 0; w < workers; ++w) {
    r.workers.emplace_back([&d, L, dependent, total] {
      for (;;) {
        const uint64_t index = L->next_block.fetch_add(1);
        if (index >= total) break;
        if (!L->cooperative) acquire_slots(d, dependent, 1);
        L->blocks_started.fetch_add(1);
        if (!L->aborted) {
          run_block(*L, index);
        }
        if (!L->cooperative) release_slots(d, dependent, 1);
      }
      const std::lock_guard<std::mutex> lock(L->m);
      if (--L->workers_left == 0) {
        if (L->cooperative) release_slots(d, dependent, static_cast<int>(total));
        L->end_ns = now_ns();
        L->completed = true;
        L->dependents_released = true;
        L->cv.notify_all();
      }
    });
  }
  const std::lock_guard<std::mutex> lock(running_mutex);
  running.push_back(std::move(r));
}

// Waits until L has completed, joins its workers, logs its end; returns its failure.
std::string wait_complete(Device& d, const std::shared_ptr<Launch>& L) {
  {
    std::unique_lock<std::mutex> lock(L->m);
    L->cv.wait(lock, [&] { return L->completed.load(); });
  }
  Running r;
  {
    const std::lock_guard<std::mutex> lock(running_mutex);
    auto it = std::find_if(running.begin(), running.end(),
                           [&](const Running& x) { return x.launch == L; });
    if (it != running.end()) {
      r = std::move(*it);
      running.erase(it);
    }
  }
  for (std::thread& t : r.workers) t.join();
  {
    const std::lock_guard<std::mutex> lock(log_mutex);
    if (r.launch && r.record < launch_log.size()) launch_log[r.record].end_ns = L->end_ns;
  }
  {
    const std::lock_guard<std::mutex> lock(d.m);
    --d.running_launches;
  }
  return L->failure;
}

// Every launch still running on the stream completes; the first failure is returned.
std::string drain(Device& d) {
  std::vector<std::shared_ptr<Launch>> pending;
  {
    const std::lock_guard<std::mutex> lock(d.m);
    pending.swap(d.in_flight);
  }
  std::string failure;
  {
    const std::lock_guard<std::mutex> lock(d.m);
    failure.swap(d.sticky);
  }
  for (const auto& L : pending) {
    const std::string f = wait_complete(d, L);
    if (failure.empty()) failure = f;
  }
  return failure;
}

std::string start_launch(int device, dim3 grid, dim3 block, bool cooperative, bool dependent,
                         std::function<void()> body) {
  Device& d = devices[device];
  const DeviceConfig c = config();
  const uint64_t total = uint64_t(grid.x) * grid.y;
  const int slots = [&] {
    const std::lock_guard<std::mutex> lock(d.m);
    return capacity(d);
  }();
  if (cooperative && total > uint64_t(slots)) {
    return "a cooperative launch of " + std::to_string(total) + " blocks does not fit the " +
           std::to_string(slots) + " resident blocks of device " + std::to_string(device);
  }
  // The stream's previous kernel: a programmatic dependent starts beside it once it has let its
  // dependents go; anything else waits for it.
  std::shared_ptr<Launch> primary;
  std::string failure;
  {
    const std::lock_guard<std::mutex> lock(d.m);
    if (dependent && !d.in_flight.empty()) primary = d.in_flight.back();
  }
  if (!primary) failure = drain(d);
  auto L = std::make_shared<Launch>();
  L->body = std::move(body);
  L->grid = grid;
  L->block = block;
  L->device = device;
  L->cooperative = cooperative;
  L->seed = c.seed;
  L->schedule = c.schedule;
  L->racecheck = c.racecheck;
  L->delays = c.delays;
  L->deadline_ns = now_ns() + static_cast<uint64_t>(c.launch_timeout_s * 1e9);
  L->primary = primary;
  size_t record = 0;
  {
    const std::lock_guard<std::mutex> lock(d.m);
    L->id = d.launch_count++;
    L->lag_us = d.lag_us;
    ++d.running_launches;
  }
  L->start_ns = now_ns();
  {
    const std::lock_guard<std::mutex> lock(log_mutex);
    record = launch_log.size();
    launch_log.push_back(
        LaunchRecord{grid.x, grid.y, block.x, cooperative, dependent, device, L->start_ns, 0});
  }
  if (total == 0) {
    L->completed = true;
    L->dependents_released = true;
    const std::lock_guard<std::mutex> lock(d.m);
    --d.running_launches;
    return failure;
  }
  const int workers = static_cast<int>(std::min<uint64_t>(total, uint64_t(slots)));
  start_workers(d, L, workers, record);
  // Wait for the grid, or for its blocks to let a dependent start (then the host may launch it).
  {
    std::unique_lock<std::mutex> lock(L->m);
    L->cv.wait(lock, [&] { return L->completed.load() || L->dependents_released.load(); });
  }
  bool early = false;
  if (!L->completed) {
    // Released by the blocks' triggers (not by all of them exiting): leave it running.
    std::unique_lock<std::mutex> lock(L->m);
    early = L->any_triggered;
    if (!early) L->cv.wait(lock, [&] { return L->completed.load(); });
  }
  if (early) {
    const std::lock_guard<std::mutex> lock(d.m);
    d.in_flight.push_back(L);
    return failure;
  }
  const std::string own = wait_complete(d, L);
  if (failure.empty()) failure = own;
  // A dependent that completed: its primary (and anything before) completes before the host
  // goes on.
  const std::string rest = drain(d);
  return failure.empty() ? rest : failure;
}

Block* block_of_caller(const char* what) {
  Block* b = current_block();
  if (b == nullptr || b->running == nullptr) {
    TORCH_CHECK(false, "emulation: ", what, " outside a kernel");
  }
  return b;
}

}  // namespace

void launch_dependents() {
  Block* b = block_of_caller("griddepcontrol.launch_dependents");
  if (b->triggered) return;  // a block triggers once (its first thread to get here)
  b->triggered = true;
  {
    const std::lock_guard<std::mutex> lock(b->launch->m);
    b->launch->any_triggered = true;
  }
  b->launch->mark_block_released();
}

void wait_for_primary() {
  Block* b = block_of_caller("griddepcontrol.wait");
  Launch* primary = b->launch->primary.get();
  if (primary == nullptr) return;  // launched after its predecessor completed
  if (!b->parked) {
    b->parked = true;
    primary->dependent_blocks_parked.fetch_add(1);
  }
  while (!primary->completed.load(std::memory_order_acquire)) poll();
  // The primary's blocks ended under its mutex (start_workers): their writes happen before this.
  const std::lock_guard<std::mutex> lock(primary->m);
}

void block_exited(Block& b) {
  if (!b.triggered) b.launch->mark_block_released();  // an exit releases the block too
  if (b.launch->primary != nullptr && !b.parked) {
    b.parked = true;
    b.launch->primary->dependent_blocks_parked.fetch_add(1);
  }
}

}  // namespace detail

using detail::devices;
using detail::kMaxDevices;

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kMixed: return "mixed";
    case Schedule::kRandom: return "random";
    case Schedule::kWarpAhead: return "warp_ahead";
    case Schedule::kWarpBehind: return "warp_behind";
    case Schedule::kInOrder: return "in_order";
  }
  return "?";
}

Schedule schedule_named(const std::string& name) {
  for (Schedule s : {Schedule::kMixed, Schedule::kRandom, Schedule::kWarpAhead,
                     Schedule::kWarpBehind, Schedule::kInOrder}) {
    if (name == schedule_name(s)) return s;
  }
  TORCH_CHECK_VALUE(false,
                    "schedule: expected mixed, random, warp_ahead, warp_behind or in_order, got '",
                    name, "'");
}

void configure(const DeviceConfig& c) {
  TORCH_CHECK_VALUE(c.sms >= 1 && c.sms <= 1024, "sms: expected a value in [1, 1024], got ", c.sms);
  TORCH_CHECK_VALUE(c.blocks_per_sm >= 1 && c.blocks_per_sm <= 32,
                    "blocks_per_sm: expected a value in [1, 32], got ", c.blocks_per_sm);
  TORCH_CHECK_VALUE(c.launch_timeout_s > 0, "launch_timeout_s: expected a positive value, got ",
                    c.launch_timeout_s);
  const std::lock_guard<std::mutex> lock(detail::config_mutex);
  for (auto& d : devices) {
    const std::lock_guard<std::mutex> dl(d.m);
    TORCH_CHECK(d.running_launches == 0, "emulation: configure() while a kernel runs");
    d.sms = c.sms;
    d.blocks_per_sm = c.blocks_per_sm;
    d.lag_us = 0;
    d.free_slots = d.free_dependent_slots = detail::capacity(d);
  }
  detail::device_config = c;
}

void configure_device(int device, int sms, int blocks_per_sm, int lag_us) {
  TORCH_CHECK_VALUE(device >= 0 && device < kMaxDevices, "device: expected [0, ", kMaxDevices,
                    "), got ", device);
  TORCH_CHECK_VALUE(sms >= 1 && sms <= 1024, "sms: expected a value in [1, 1024], got ", sms);
  TORCH_CHECK_VALUE(blocks_per_sm >= 1 && blocks_per_sm <= 32,
                    "blocks_per_sm: expected a value in [1, 32], got ", blocks_per_sm);
  TORCH_CHECK_VALUE(lag_us >= 0 && lag_us <= 1000000,
                    "lag_us: expected a value in [0, 1000000], got ", lag_us);
  auto& d = devices[device];
  const std::lock_guard<std::mutex> dl(d.m);
  TORCH_CHECK(d.running_launches == 0, "emulation: configure_device() while a kernel runs");
  d.sms = sms;
  d.blocks_per_sm = blocks_per_sm;
  d.lag_us = lag_us;
  d.free_slots = d.free_dependent_slots = detail::capacity(d);
}

int device_sms(int device) {
  const std::lock_guard<std::mutex> dl(devices[device].m);
  return devices[device].sms;
}

int device_blocks_per_sm(int device) {
  const std::lock_guard<std::mutex> dl(devices[device].m);
  return devices[device].blocks_per_sm;
}

DeviceConfig config() {
  const std::lock_guard<std::mutex> lock(detail::config_mutex);
  return detail::device_config;
}

int device_count() { return kMaxDevices; }

uint64_t host_draw(uint64_t salt) {
  return detail::mix(config().seed * 0x9e3779b97f4a7c15ull + salt);
}

std::string launch(int device, dim3 grid, dim3 block, bool cooperative, bool dependent,
                   std::function<void()> body) {
  if (device < 0 || device >= kMaxDevices) return "no emulated device " + std::to_string(device);
  if (block.y != 1 || block.z != 1 || grid.z != 1) return "only 1-D blocks and 2-D grids";
  if (block.x < detail::kWarp || block.x > 1024 || block.x % detail::kWarp != 0) {
    return "block size " + std::to_string(block.x) + ": expected a multiple of 32 up to 1024";
  }
  auto& d = devices[device];
  std::shared_ptr<Graph> capture;
  {
    const std::lock_guard<std::mutex> lock(d.m);
    capture = d.capture;
  }
  if (capture) {
    capture->nodes.push_back(
        [=]() { return detail::start_launch(device, grid, block, cooperative, dependent, body); });
    return "";
  }
  return detail::start_launch(device, grid, block, cooperative, dependent, std::move(body));
}

std::string synchronize(int device) { return detail::drain(devices[device]); }

namespace {

// A copy of a log, or (reset) its emptying, under the logs' lock.
template <class Record>
std::vector<Record> log_of(std::vector<Record>& log, bool reset) {
  const std::lock_guard<std::mutex> lock(detail::log_mutex);
  if (reset) {
    log.clear();
    return {};
  }
  return log;
}

}  // namespace

std::vector<LaunchRecord> launches() { return log_of(detail::launch_log, false); }

void reset_launches() { log_of(detail::launch_log, true); }

std::vector<EventRecord> events() { return log_of(detail::event_log, false); }

void reset_events() { log_of(detail::event_log, true); }

// ---- capture ------------------------------------------------------------------------------------

Graph::~Graph() {
  for (auto& release : releases) release();
}

namespace detail {
namespace {

std::atomic<int> capturing_devices{0};

// The graph the calling host thread's device is capturing, if any.
std::shared_ptr<Graph> capturing_graph() {
  if (capturing_devices.load(std::memory_order_acquire) == 0) return nullptr;
  auto& d = devices[host_device];
  const std::lock_guard<std::mutex> lock(d.m);
  return d.capture;
}

// Host tensors an op makes and drops while its stream captures (a bf16 weight converted to fp32,
// an aligned copy) are what its captured kernels read at every replay: on a GPU they are device
// tensors in the graph's memory pool, made by captured kernels. Here they are made once, at
// capture, by the host, and this allocator keeps them (contents and all) for the graph instead
// of freeing them.
class CapturingCpuAllocator final : public c10::Allocator {
 public:
  explicit CapturingCpuAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t bytes) override {
    auto* held = new c10::DataPtr(base_->allocate(bytes));
    void* data = held->get();
    return {data, held, &release, held->device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  static void release(void* ctx) {
    auto* held = static_cast<c10::DataPtr*>(ctx);
    if (std::shared_ptr<Graph> g = capturing_graph()) {
      g->releases.push_back([held] { delete held; });
      return;
    }
    delete held;
  }
  c10::Allocator* base_;
};

// In front of torch's CPU allocator while some device captures, and only then: what is allocated
// meanwhile carries its own deleter, so restoring the allocator leaves it alone.
std::mutex cpu_allocator_mutex;
c10::Allocator* torch_cpu_allocator = nullptr;
int capturing_threads = 0;

void capture_cpu_allocations(bool on) {
  const std::lock_guard<std::mutex> lock(cpu_allocator_mutex);
  static CapturingCpuAllocator* wrapper = nullptr;
  if (on && capturing_threads++ == 0) {
    torch_cpu_allocator = c10::GetCPUAllocator();
    if (wrapper == nullptr) wrapper = new CapturingCpuAllocator(torch_cpu_allocator);
    c10::SetCPUAllocator(wrapper, /*priority=*/100);
  } else if (!on && --capturing_threads == 0) {
    c10::SetCPUAllocator(torch_cpu_allocator, /*priority=*/100);
  }
}

}  // namespace
}  // namespace detail

void begin_capture(int device) {
  TORCH_CHECK_VALUE(device >= 0 && device < kMaxDevices, "device: no emulated device ", device);
  auto& d = devices[device];
  TORCH_CHECK(detail::drain(d).empty(), "emulation: the stream failed before its capture");
  {
    const std::lock_guard<std::mutex> lock(d.m);
    TORCH_CHECK(!d.capture, "emulation: device ", device, " is capturing already");
    d.capture = std::make_shared<Graph>();
    d.capture->device = device;
    ++detail::capturing_devices;
  }
  detail::capture_cpu_allocations(true);
}

std::shared_ptr<Graph> end_capture(int device) {
  auto& d = devices[device];
  std::shared_ptr<Graph> g;
  {
    const std::lock_guard<std::mutex> lock(d.m);
    TORCH_CHECK(d.capture, "emulation: device ", device, " is not capturing");
    g = std::move(d.capture);
    d.capture.reset();
    --detail::capturing_devices;
  }
  detail::capture_cpu_allocations(false);
  return g;
}

void replay(const std::shared_ptr<Graph>& graph) {
  TORCH_CHECK_VALUE(graph != nullptr, "graph: expected a captured graph");
  std::string failure;
  for (const auto& node : graph->nodes) {
    const std::string f = node();
    if (failure.empty()) failure = f;
  }
  const std::string rest = detail::drain(devices[graph->device]);
  if (failure.empty()) failure = rest;
  TORCH_CHECK(failure.empty(), "emulation: a replayed kernel failed: ", failure);
}

namespace detail {
namespace {

// A stream operation other than a launch: everything before it completes first (its failure is
// the operation's); while the stream captures, the operation is recorded instead.
cudaError_t stream_op(int device, std::function<void()> op) {
  auto& d = devices[device];
  std::shared_ptr<Graph> capture;
  {
    const std::lock_guard<std::mutex> lock(d.m);
    capture = d.capture;
  }
  if (capture) {
    capture->nodes.push_back([op]() {
      op();
      return std::string();
    });
    return cudaSuccess;
  }
  const std::string failure = drain(d);
  op();
  if (!failure.empty()) {
    last_error = failure;
    return cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

void log_event(int device, const char* what, cudaEvent_t e) {
  const std::lock_guard<std::mutex> lock(log_mutex);
  event_log.push_back(EventRecord{device, what, e->id});
}

}  // namespace
}  // namespace detail

int stream_device(cudaStream_t stream) {
  return stream != nullptr ? stream->device : detail::host_device;
}

cudaStream_t device_stream(int device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "emulation: no device ", device);
  return &detail::streams[device];
}

cudaError_t record_launch_error(const std::string& what) {
  detail::last_error = what;
  return cudaErrorLaunchFailure;
}

}  // namespace mhc_sp::emulation

// ---- the runtime API subset ---------------------------------------------------------------------

using mhc_sp::emulation::stream_device;
using mhc_sp::emulation::detail::host_device;
using mhc_sp::emulation::detail::kMaxDevices;
using mhc_sp::emulation::detail::last_error;

cudaError_t cudaGetDevice(int* device) {
  *device = host_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidValue;
  host_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (attr != cudaDevAttrMultiProcessorCount || device < 0 || device >= kMaxDevices) {
    return cudaErrorInvalidValue;
  }
  *value = mhc_sp::emulation::device_sms(device);
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return cudaSuccess; }  // launches report their own errors

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorLaunchFailure: return last_error.c_str();
    default: return "unknown error";
  }
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  if (bytes > 0 && p == nullptr) return cudaErrorInvalidValue;
  return mhc_sp::emulation::detail::stream_op(stream_device(stream), [=] {
    if (bytes > 0) std::memset(p, value, bytes);
  });
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  const size_t size = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  *p = std::aligned_alloc(64, size);
  if (*p == nullptr) return cudaErrorInvalidValue;
  // The host reads and writes it while kernels do: system memory (.sys scope, atomic polls).
  mhc_sp::emulation::add_system_memory(*p, size, "host-mapped memory");
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned) {
  *device = host;  // host-mapped memory: the same address on the emulated device
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  mhc_sp::emulation::remove_system_memory(p);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = new CUevent_st{mhc_sp::emulation::detail::next_event++};
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  return cudaEventRecordWithFlags(e, stream, cudaEventRecordDefault);
}

// Everything before a record has completed when it runs (a stream operation), so an event is
// complete once recorded and every wait is satisfied; the operations are logged (events()).
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t stream, unsigned) {
  if (e == nullptr) return cudaErrorInvalidValue;
  const int device = stream_device(stream);
  return mhc_sp::emulation::detail::stream_op(
      device, [=] { mhc_sp::emulation::detail::log_event(device, "record", e); });
}

cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned) {
  if (e == nullptr) return cudaErrorInvalidValue;
  const int device = stream_device(stream);
  return mhc_sp::emulation::detail::stream_op(
      device, [=] { mhc_sp::emulation::detail::log_event(device, "wait", e); });
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  const std::string failure = mhc_sp::emulation::synchronize(stream_device(stream));
  return failure.empty() ? cudaSuccess : mhc_sp::emulation::record_launch_error(failure);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  auto& d = mhc_sp::emulation::detail::devices[stream_device(stream)];
  const std::lock_guard<std::mutex> lock(d.m);
  *status = d.capture ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

// ---- the device allocator -----------------------------------------------------------------------

namespace c10::cuda::CUDACachingAllocator {
namespace {

// Memory is freed in stream order: while the current device's stream captures, the graph keeps
// it (as a graph's private pool does); otherwise every launch that may use it has completed (a
// launch returns once its grid has, or its dependent's host launch follows it at once).
void free_device_memory(void* p) {
  auto& d = mhc_sp::emulation::detail::devices[host_device];
  {
    const std::lock_guard<std::mutex> lock(d.m);
    if (d.capture) {
      d.capture->releases.push_back([p] { std::free(p); });
      return;
    }
  }
  const std::string failure = mhc_sp::emulation::detail::drain(d);
  if (!failure.empty()) {  // kept for the stream's next operation
    const std::lock_guard<std::mutex> lock(d.m);
    if (d.sticky.empty()) d.sticky = failure;
  }
  std::free(p);
}

class EmulatedDeviceAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    const size_t size = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, size);
    TORCH_CHECK(p != nullptr, "emulation: out of memory allocating ", bytes, " bytes");
    std::memset(p, 0xff, size);
    return {p, p, &free_device_memory, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_device_memory; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

}  // namespace

c10::Allocator* get() {
  static EmulatedDeviceAllocator allocator;
  return &allocator;
}

}  // namespace c10::cuda::CUDACachingAllocator
