// SPDX-License-Identifier: Apache-2.0
// The shared-memory workspace: POSIX segments laid out and driven as mhc_sp/boundary_protocol.h
// describes. Everything here is host code; the rows themselves are read and written by
// transport/shm/communicator.cpp and the CPU kernels.

#include "transport/shm/workspace.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "mhc_sp/comm.h"

namespace mhc_sp::shm {
namespace {

using Clock = std::chrono::steady_clock;

// Waiting: spin through the short waits of balanced ranks, then sleep on the peer's futex word
// until it arrives (it wakes its sleepers). While ranks fit the cores a spin is cheaper than a
// sleep and its wake-up; when they outnumber the cores, the rank being waited for may need this
// very core, so the wait sleeps almost at once.
constexpr auto kSpinForOwnCore = std::chrono::microseconds(100);
constexpr auto kSpinForSharedCore = std::chrono::microseconds(5);
constexpr int kSpinsPerClock = 64;
constexpr auto kCheckEvery = std::chrono::microseconds(5000);  // liveness, timeout, broken word

constexpr int64_t kInitialHalfBytes = int64_t{1} << 20;
// Rows published into the segment are copied in chunks of this size, the broken word checked
// before each (rule 6): what a rank stopped mid-copy may still write once it runs again.
constexpr int64_t kWriteChunk = int64_t{64} << 10;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string errno_text(int err) { return std::string(std::strerror(err)); }

// Shared (not process-private) futexes: the words live in a segment mapped by several processes.
void futex_wait(uint32_t* word, uint32_t seen, std::chrono::microseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000),
              static_cast<long>(timeout.count() % 1000000) * 1000};
  syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake_all(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// The process is gone: no /proc entry, or a zombie waiting to be reaped.
bool process_gone(int64_t pid) {
  if (pid <= 0) return false;
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the command name may itself contain ')'
  if (!paren || paren[1] == '\0' || paren[2] == '\0') return false;
  return paren[2] == 'Z' || paren[2] == 'X';
}

struct Unlinker {
  std::string name;
  ~Unlinker() {
    if (!name.empty()) ::shm_unlink(name.c_str());
  }
};

Segment map_fd(int fd, int64_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  TORCH_CHECK(p != MAP_FAILED, "shm: cannot map segment ", name, " (", bytes,
              " bytes): ", errno_text(err));
  return Segment(static_cast<uint8_t*>(p), bytes);
}

// Creates, sizes (reserving the memory, so that a full /dev/shm is an error here rather than a
// SIGBUS later) and maps a segment only this user can open.
Segment create_segment(const std::string& name, int64_t world, int64_t half_bytes) {
  const int64_t bytes = bp::segment_bytes(world, half_bytes);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, S_IRUSR | S_IWUSR);
  const int err = errno;
  TORCH_CHECK(fd >= 0, "shm: cannot create segment ", name, ": ", errno_text(err));
  Unlinker unlink_on_error{name};
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  TORCH_CHECK(::fchmod(fd, S_IRUSR | S_IWUSR) == 0, "shm: cannot restrict segment ", name, ": ",
              errno_text(errno));
  const int rc = ::posix_fallocate(fd, 0, bytes);
  TORCH_CHECK(rc == 0, "shm: cannot reserve ", bytes,
              " bytes for the workspace in /dev/shm: ", errno_text(rc), " (", world,
              " ranks x 2 halves x ", half_bytes, " bytes)");
  Segment seg = map_fd(fd, bytes, name);
  auto* h = seg.header();
  h->version = bp::kVersion;
  h->world = static_cast<uint32_t>(world);
  h->half_bytes = static_cast<uint64_t>(half_bytes);
  h->total_bytes = static_cast<uint64_t>(bytes);
  __atomic_store_n(&h->magic, bp::kMagic, __ATOMIC_RELEASE);
  unlink_on_error.name.clear();
  return seg;
}

// Opens and maps a segment made by rank 0, waiting until it exists and is complete. The segment
// is trusted only after it proves to be this user's private, complete, and of the geometry the
// caller expects (half_bytes < 0: any).
Segment open_segment(const std::string& name, int64_t world, int64_t half_bytes,
                     Clock::time_point deadline) {
  std::string last = "it does not exist yet";
  while (true) {
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd >= 0) {
      struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
      } closer{fd};
      struct stat st{};
      TORCH_CHECK(::fstat(fd, &st) == 0, "shm: cannot stat segment ", name, ": ",
                  errno_text(errno));
      TORCH_CHECK(st.st_uid == ::geteuid() && (st.st_mode & 077) == 0, "shm: segment ", name,
                  " is not private to this user (uid ", st.st_uid, ", mode ", std::oct,
                  (st.st_mode & 0777), "); refusing it");
      const int64_t bytes = st.st_size;
      if (bytes >= bp::slots_offset(1)) {
        Segment seg = map_fd(fd, bytes, name);
        const auto* h = seg.header();
        if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == bp::kMagic) {
          TORCH_CHECK(h->version == bp::kVersion, "shm: segment ", name, " has protocol version ",
                      h->version, ", this build speaks ", bp::kVersion);
          TORCH_CHECK(h->world == static_cast<uint64_t>(world), "shm: segment ", name, " is for ",
                      h->world, " ranks, the group has ", world);
          const auto half = static_cast<int64_t>(h->half_bytes);
          TORCH_CHECK(half > 0 && half % bp::kAlign == 0 && half >= bp::call_layout(0, 0).need &&
                          (half_bytes < 0 || half == half_bytes) &&
                          static_cast<int64_t>(h->total_bytes) == bytes &&
                          bp::segment_bytes(world, half) == bytes,
                      "shm: segment ", name, " is inconsistent: ", bytes, " bytes, header says ",
                      h->total_bytes, " bytes and half size ", half,
                      half_bytes < 0 ? std::string() : c10::str(" (expected ", half_bytes, ")"));
          return seg;
        }
        last = "it is not initialised yet";
      } else {
        last = "it is not sized yet";
      }
    } else if (errno != ENOENT) {
      TORCH_CHECK(false, "shm: cannot open segment ", name, ": ", errno_text(errno));
    }
    TORCH_CHECK(Clock::now() < deadline, "shm: segment ", name, " did not appear in time (", last,
                "): rank 0 did not create it");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Rows published for the peers bypass this core's caches when there are many of them: streaming
// stores skip reading every destination line before writing it (a quarter less time for the
// partial's copy at 2048 tokens, H = 4096, 2 ranks), and the peers read the rows from memory
// either way. Small publications stay in the caches the peers may hit. x86-64 has SSE2 always.
constexpr int64_t kStreamingBytes = int64_t{1} << 20;

void copy_streaming(uint8_t* dst, const uint8_t* src, int64_t n) {
#if defined(__x86_64__)
  int64_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 15) != 0; ++i) dst[i] = src[i];
  for (; i + 64 <= n; i += 64) {
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1);
    const __m128i c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  std::memcpy(dst + i, src + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

// Streaming stores are weakly ordered: this fence orders them before the release store with which
// the barrier publishes them (rule 3).
void fence_streaming() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

void unlink_quietly(const std::string& name) {
  if (!name.empty()) ::shm_unlink(name.c_str());  // ENOENT: rank 0 or a peer already did
}

// The first rank to blame a peer is the one recorded (like `broken`, rule 6).
void mark_broken(bp::SegmentHeader* h, int64_t rank, int64_t culprit, bp::Fault why) {
  bp::blame(&h->blamed, bp::blame_word(culprit, why));
  bp::mark_broken(&h->broken, static_cast<uint32_t>(rank));
}

const char* tensor_arg(bp::Op op) {
  return op == bp::Op::kFusedLayer || op == bp::Op::kFusedHead ? "partial" : "x";
}

}  // namespace

const char* op_name(bp::Op op) {
  switch (op) {
    case bp::Op::kAllGather: return "all_gather";
    case bp::Op::kReduceScatter: return "reduce_scatter";
    case bp::Op::kAllReduce: return "all_reduce";
    case bp::Op::kFusedEntry: return "fused_entry";
    case bp::Op::kFusedLayer: return "fused_layer";
    case bp::Op::kFusedHead: return "fused_head";
    default: return "an unknown op";
  }
}

Segment::Segment(Segment&& other) noexcept : base_(other.base_), bytes_(other.bytes_) {
  other.base_ = nullptr;
  other.bytes_ = 0;
}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    if (base_) ::munmap(base_, static_cast<size_t>(bytes_));
    base_ = other.base_;
    bytes_ = other.bytes_;
    other.base_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Segment::~Segment() {
  if (base_) ::munmap(base_, static_cast<size_t>(bytes_));
}

// ---- Workspace ----------------------------------------------------------------------------

Workspace::Workspace(std::string group, int64_t rank, int64_t world, const std::string& segment,
                     std::chrono::milliseconds timeout)
    : group_(std::move(group)), name_(segment), rank_(rank), world_(world), timeout_(timeout) {
  cpu_set_t cpus;
  const int64_t cores = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  spin_for_ = world <= cores ? kSpinForOwnCore : kSpinForSharedCore;
  TORCH_CHECK_VALUE(world >= 2 && world <= bp::kMaxWorld, "group: the shm transport serves 2 to ",
                    bp::kMaxWorld, " ranks, got ", world);
  // Room for the suffix of grown segments ("_<generation>").
  TORCH_CHECK_VALUE(segment.size() >= 2 && segment.size() + 12 < bp::kNameBytes &&
                        segment[0] == '/' && segment.find('/', 1) == std::string::npos,
                    "segment: expected a POSIX shared-memory name, got '", segment, "'");
  // Whoever fails to join removes the segment: rank 0 may have died after creating it.
  Unlinker unlink{segment};
  seg_ = rank == 0 ? create_segment(segment, world, kInitialHalfBytes)
                   : open_segment(segment, world, -1, Clock::now() + timeout_);
  seg_name_ = segment;
  __atomic_store_n(&seg_.control(rank_)->pid, static_cast<int64_t>(::getpid()), __ATOMIC_RELAXED);
  barrier("joining the workspace");
  // Every rank has mapped it: rank 0 unlinks it now (Unlinker), the others leave it to rank 0.
  if (rank != 0) unlink.name.clear();
}

Workspace::~Workspace() {
  // A peer still waiting for this rank (it left between calls, e.g. after an error elsewhere)
  // fails at once instead of after the timeout; nothing is written into a broken workspace.
  if (seg_.base() && broken_.empty() && bp::load_broken(&seg_.header()->broken) == 0) {
    __atomic_store_n(&seg_.control(rank_)->pid, -static_cast<int64_t>(::getpid()),
                     __ATOMIC_RELAXED);
  }
  unlink_quietly(seg_name_);
}

std::string Workspace::blame() const {
  const uint32_t word = __atomic_load_n(&seg_.header()->blamed, __ATOMIC_RELAXED);
  const int64_t culprit = bp::blamed_rank(word);
  if (culprit < 0 || culprit >= world_) return "";
  switch (bp::blamed_fault(word)) {
    case bp::Fault::kExited: return c10::str("rank ", culprit, " exited or left the workspace");
    case bp::Fault::kTimedOut:
      return c10::str("rank ", culprit, " did not arrive within ", timeout_.count() / 1000.0, " s");
    case bp::Fault::kMismatch: return c10::str("rank ", culprit, " made a different call");
    case bp::Fault::kError: return c10::str("rank ", culprit, " failed");
    default: return "";
  }
}

void Workspace::fail(const std::string& message, int64_t culprit, bp::Fault why) {
  broken_ = message;
  mark_broken(seg_.header(), rank_, culprit, why);
  unlink_quietly(seg_name_);
  TORCH_CHECK(false, message);
}

void Workspace::fail_after_peer(const char* what) {
  const uint32_t by = bp::load_broken(&seg_.header()->broken);
  const std::string culprit = blame();
  broken_ = c10::str(culprit.empty() ? std::string() : c10::str(culprit, ", so "), "rank ", by - 1,
                     " gave up on the workspace (see rank ", by - 1, "'s error)");
  unlink_quietly(seg_name_);
  TORCH_CHECK(false, "group '", group_, "' (shm transport): ", broken_, "; seen during ", what,
              "; the workspace is broken: call mhc_sp.distributed.init(group) on every rank for "
              "a new one");
}

void Workspace::fail_if_peer_gave_up(const char* what) {
  if (bp::load_broken(&seg_.header()->broken) != 0) fail_after_peer(what);
}

void Workspace::check_usable(const char* what) {
  TORCH_CHECK(broken_.empty(), "group '", group_,
              "' (shm transport): the workspace is broken by an earlier error (", broken_,
              "); call mhc_sp.distributed.init(group) on every rank for a new one");
  fail_if_peer_gave_up(what);
}

void Workspace::barrier(const char* what) {
  arrive_and_wait(what);
  fail_if_peer_gave_up(what);
}

void Workspace::arrive_and_wait(const char* what) {
  // A rank that resumes after its peers gave up (e.g. it was stopped) does not even arrive.
  fail_if_peer_gave_up(what);
  const uint64_t e = ++epoch_;
  bp::RankControl* mine = seg_.control(rank_);
  bp::store_release(&mine->arrived, e);
  __atomic_store_n(&mine->arrived_low, static_cast<uint32_t>(e), __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&mine->sleepers, __ATOMIC_SEQ_CST) != 0) futex_wake_all(&mine->arrived_low);
  const auto start = Clock::now();
  auto next_check = start + kCheckEvery;
  int spins = 0;
  bool spinning = true;
  for (int64_t p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    bp::RankControl* peer = seg_.control(p);
    while (bp::load_acquire(&peer->arrived) < e) {
      if (spinning && ++spins % kSpinsPerClock != 0) {
        cpu_relax();
        continue;
      }
      if (spinning) {
        spinning = Clock::now() - start < spin_for_;
        continue;
      }
      // Once a peer gave up, this rank writes nothing more into the segment (rule 6): it neither
      // announces a sleep nor takes back one it announced before it was stopped.
      const bool gave_up = bp::load_broken(&seg_.header()->broken) != 0;
      if (!gave_up) {
        // Announce the sleep before the last look (both sequentially consistent), so that either
        // this look sees the arrival or the arriving peer sees a sleeper and wakes it.
        __atomic_fetch_add(&peer->sleepers, 1, __ATOMIC_SEQ_CST);
        const uint32_t seen = __atomic_load_n(&peer->arrived_low, __ATOMIC_SEQ_CST);
        if (bp::load_acquire(&peer->arrived) < e) {
          futex_wait(&peer->arrived_low, seen, kCheckEvery);
        }
        if (bp::load_broken(&seg_.header()->broken) == 0) {
          __atomic_fetch_sub(&peer->sleepers, 1, __ATOMIC_SEQ_CST);
        }
      }
      const auto now = Clock::now();
      if (!gave_up && now < next_check) continue;
      next_check = now + kCheckEvery;
      if (bp::load_acquire(&peer->arrived) >= e) break;
      if (bp::load_broken(&seg_.header()->broken) != 0) fail_after_peer(what);
      const int64_t pid = __atomic_load_n(&seg_.control(p)->pid, __ATOMIC_RELAXED);
      if (pid < 0) {
        fail(c10::str("group '", group_, "' (shm transport): rank ", p, " (pid ", -pid,
                      ") left the workspace (its group was destroyed or initialised again) "
                      "during ",
                      what, "; the workspace is now broken"),
             p, bp::Fault::kExited);
      }
      if (process_gone(pid)) {
        fail(c10::str("group '", group_, "' (shm transport): rank ", p, " (pid ", pid,
                      ") exited during ", what, "; the workspace is now broken"),
             p, bp::Fault::kExited);
      }
      if (now - start >= timeout_) {
        fail(c10::str("group '", group_, "' (shm transport): rank ", p, " did not reach ", what,
                      " within ", timeout_.count() / 1000.0,
                      " s (the group's timeout); the workspace is now broken"),
             p, bp::Fault::kTimedOut);
      }
    }
  }
}

void Workspace::write_checked(uint8_t* dst, const void* src, int64_t bytes, const char* what) {
  if (bytes <= 0) return;
  const uint32_t* broken = &seg_.header()->broken;
  std::atomic<bool> stopped{false};
  const int64_t chunks = (bytes + kWriteChunk - 1) / kWriteChunk;
  const bool streaming = bytes >= kStreamingBytes;
  // Large copies split across the threads the op may use (64 chunks: 4 MiB per task at least).
  at::parallel_for(0, chunks, 64, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      if (bp::load_broken(broken) != 0) {
        stopped.store(true, std::memory_order_relaxed);
        break;
      }
      const int64_t lo = c * kWriteChunk, hi = std::min(bytes, lo + kWriteChunk);
      if (streaming) {
        copy_streaming(dst + lo, static_cast<const uint8_t*>(src) + lo, hi - lo);
      } else {
        std::memcpy(dst + lo, static_cast<const uint8_t*>(src) + lo, hi - lo);
      }
    }
    if (streaming) fence_streaming();  // on every thread that streamed
  });
  if (stopped.load(std::memory_order_relaxed)) fail_after_peer(what);
}

void Workspace::check_headers(int64_t half) {
  const auto& ref = *reinterpret_cast<const bp::CallHeader*>(seg_.half(0, half));
  for (int64_t r = 1; r < world_; ++r) {
    const auto& h = *reinterpret_cast<const bp::CallHeader*>(seg_.half(r, half));
    if (bp::same_call(ref, h)) continue;
    const auto op0 = static_cast<bp::Op>(ref.op), op = static_cast<bp::Op>(h.op);
    std::string detail;
    const char* arg = "group";
    if (ref.call != h.call || ref.epoch != h.epoch || ref.op != h.op || ref.flags != h.flags) {
      detail =
          c10::str("rank 0 called ", op_name(op0), (ref.flags & bp::kSharded) ? " (sharded)" : "",
                   " as call ", ref.call, ", rank ", r, " called ", op_name(op),
                   (h.flags & bp::kSharded) ? " (sharded)" : "", " as call ", h.call);
    } else if (ref.num_tokens != h.num_tokens) {
      arg = "num_tokens";
      detail = c10::str("rank 0 passed ", ref.num_tokens, ", rank ", r, " passed ", h.num_tokens);
    } else if (ref.rows != h.rows || ref.inner != h.inner) {
      arg = tensor_arg(op0);
      detail = c10::str("rank 0 passed ", ref.rows, " rows of ", ref.inner, " elements, rank ", r,
                        " passed ", h.rows, " rows of ", h.inner);
    } else {
      arg = tensor_arg(op0);
      detail = c10::str("rank 0 passed dtype ", static_cast<c10::ScalarType>(ref.dtype), ", rank ",
                        r, " passed ", static_cast<c10::ScalarType>(h.dtype));
    }
    broken_ = c10::str(arg, ": ranks disagree on ", op_name(op0), ": ", detail);
    mark_broken(seg_.header(), rank_, r, bp::Fault::kMismatch);
    unlink_quietly(seg_name_);
    TORCH_CHECK_VALUE(false, broken_, " (group '", group_,
                      "', shm transport: every rank must make "
                      "the same call; the workspace is now broken)");
  }
}

void Workspace::grow(int64_t need) {
  const int64_t half = bp::align_up(std::max(need, 2 * seg_.half_bytes()), bp::kPage);
  // Every rank knows the name, so any rank that fails removes the segment (rank 0 may die after
  // creating it); rank 0 also announces it in next_name (rule 7).
  const std::string name = c10::str(name_, "_", generation_ + 1);
  Unlinker unlink{name};
  Segment next;
  if (rank_ == 0) {
    std::memset(seg_.header()->next_name, 0, bp::kNameBytes);
    std::memcpy(seg_.header()->next_name, name.data(), name.size());
    try {
      next = create_segment(name, world_, half);
    } catch (const c10::Error& e) {
      fail(c10::str("group '", group_, "' (shm transport): cannot grow the workspace to ", half,
                    " bytes per rank and half: ", e.what_without_backtrace()),
           rank_, bp::Fault::kError);
    }
  }
  barrier("growing the workspace");
  if (rank_ != 0) {
    const auto* raw = seg_.header()->next_name;
    const std::string announced(raw, strnlen(raw, bp::kNameBytes));
    try {
      TORCH_CHECK(announced == name, "rank 0 announced segment '", announced, "', expected '", name,
                  "'");
      next = open_segment(name, world_, half, Clock::now() + timeout_);
    } catch (const c10::Error& e) {
      fail(c10::str("group '", group_, "' (shm transport): cannot map the grown workspace: ",
                    e.what_without_backtrace()),
           rank_, bp::Fault::kError);
    }
  }
  __atomic_store_n(&next.control(rank_)->pid, static_cast<int64_t>(::getpid()), __ATOMIC_RELAXED);
  barrier("growing the workspace");
  seg_ = std::move(next);
  seg_name_ = name;
  ++generation_;
  epoch_ = 0;
  // Every rank has mapped it: rank 0 unlinks it now (Unlinker), the others leave it to rank 0.
  if (rank_ != 0) unlink.name.clear();
}

Call Workspace::start(bp::Op op, uint32_t flags, int64_t rows, int64_t num_tokens, int64_t inner,
                      at::ScalarType dtype) {
  std::unique_lock<std::mutex> lock(mutex_);
  check_usable(op_name(op));
  bp::CallHeader h{};
  h.op = static_cast<uint32_t>(op);
  h.flags = flags;
  h.rows = rows;
  h.num_tokens = num_tokens;
  h.inner = inner;
  h.dtype = static_cast<uint32_t>(dtype);
  h.elem_bytes = static_cast<uint32_t>(c10::elementSize(dtype));
  h.call = calls_++;
  h.epoch = epoch_ + 1;
  const int64_t need = bp::layout_for(h, world_).need;
  if (need > seg_.half_bytes()) {
    // Rule 7: the headers are compared before anyone acts on their size.
    const int64_t half = static_cast<int64_t>(h.call % 2);
    *reinterpret_cast<bp::CallHeader*>(seg_.half(rank_, half)) = h;
    arrive_and_wait(op_name(op));
    check_headers(half);
    fail_if_peer_gave_up(op_name(op));
    grow(need);
    h.epoch = epoch_ + 1;
  }
  return Call(*this, std::move(lock), h);
}

// ---- Call ---------------------------------------------------------------------------------

Call::Call(Workspace& ws, std::unique_lock<std::mutex> lock, const bp::CallHeader& h)
    : ws_(ws),
      lock_(std::move(lock)),
      header_(h),
      layout_(bp::layout_for(h, ws.world_)),
      rank_(ws.rank_) {
  const int64_t half = static_cast<int64_t>(h.call % 2);
  halves_.resize(static_cast<size_t>(ws.world_));
  for (int64_t r = 0; r < ws.world_; ++r) halves_[r] = ws.seg_.half(r, half);
  TORCH_INTERNAL_ASSERT(layout_.need <= ws.seg_.half_bytes());
  *reinterpret_cast<bp::CallHeader*>(halves_[rank_]) = h;
}

Call::~Call() {
  if (done_ || !ws_.broken_.empty()) return;
  ws_.broken_ = c10::str("rank ", rank_, " abandoned ", op_name(static_cast<bp::Op>(header_.op)),
                         " after an error");
  mark_broken(ws_.seg_.header(), rank_, rank_, bp::Fault::kError);
}

void Call::write_in(const void* src, int64_t offset, int64_t bytes) {
  ws_.write_checked(in() + offset, src, bytes, op_name(static_cast<bp::Op>(header_.op)));
}

void Call::write_out(const void* src, int64_t offset, int64_t bytes) {
  ws_.write_checked(out() + offset, src, bytes, op_name(static_cast<bp::Op>(header_.op)));
}

void Call::publish() {
  const char* what = op_name(static_cast<bp::Op>(header_.op));
  ws_.arrive_and_wait(what);
  // Headers first: a mismatch is a ValueError on every rank, whoever marked the workspace first.
  ws_.check_headers(static_cast<int64_t>(header_.call % 2));
  ws_.fail_if_peer_gave_up(what);
}

void Call::barrier() { ws_.barrier(op_name(static_cast<bp::Op>(header_.op))); }

}  // namespace mhc_sp::shm

namespace mhc_sp {

std::string new_shm_segment_name() {
  std::random_device device;  // /dev/urandom
  std::string name = "/mhc_sp_";
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 4; ++i) {  // 128 random bits
    const uint32_t v = device();
    for (int k = 0; k < 8; ++k) name += hex[(v >> (4 * k)) & 15];
  }
  return name;
}

}  // namespace mhc_sp
