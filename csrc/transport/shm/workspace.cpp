// SPDX-License-Identifier: Apache-2.0
// The shared-memory workspace: the protocol of mhc_sp/detail/boundary_protocol.h over POSIX
// segments (transport/shm/segment.h). Everything here is host code; the rows themselves are read
// and written by transport/shm/communicator.cpp and the CPU kernels.

#include "transport/shm/workspace.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace mhc_sp::shm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kInitialHalfBytes = int64_t{1} << 20;
// Rows published into the segment are copied in chunks of this size, the broken word checked
// before each (rule 6): what a rank stopped mid-copy may still write once it runs again.
constexpr int64_t kWriteChunk = int64_t{64} << 10;

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

const char* tensor_arg(bp::Op op) {
  return op == bp::Op::kFusedLayer || op == bp::Op::kFusedHead ? "partial" : "x";
}

// Name of the op behind a protocol Op, for errors.
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

// What rank r's header differs from rank 0's in: the argument to name and the detail.
std::pair<const char*, std::string> mismatch(const bp::CallHeader& ref, const bp::CallHeader& h,
                                             int64_t r) {
  const auto op0 = static_cast<bp::Op>(ref.op), op = static_cast<bp::Op>(h.op);
  if (ref.call != h.call || ref.epoch != h.epoch || ref.op != h.op || ref.flags != h.flags) {
    return {"group",
            c10::str("rank 0 called ", op_name(op0), (ref.flags & bp::kSharded) ? " (sharded)" : "",
                     " as call ", ref.call, ", rank ", r, " called ", op_name(op),
                     (h.flags & bp::kSharded) ? " (sharded)" : "", " as call ", h.call)};
  }
  if (ref.num_tokens != h.num_tokens) {
    return {"num_tokens",
            c10::str("rank 0 passed ", ref.num_tokens, ", rank ", r, " passed ", h.num_tokens)};
  }
  if (ref.rows != h.rows || ref.inner != h.inner) {
    return {tensor_arg(op0),
            c10::str("rank 0 passed ", ref.rows, " rows of ", ref.inner, " elements, rank ", r,
                     " passed ", h.rows, " rows of ", h.inner)};
  }
  return {tensor_arg(op0),
          c10::str("rank 0 passed dtype ", static_cast<c10::ScalarType>(ref.dtype), ", rank ", r,
                   " passed ", static_cast<c10::ScalarType>(h.dtype))};
}

}  // namespace

// ---- Workspace ----------------------------------------------------------------------------

Workspace::Workspace(std::string group, int64_t rank, int64_t world, const std::string& segment,
                     std::chrono::milliseconds timeout)
    : group_(std::move(group)),
      name_(segment),
      rank_(rank),
      world_(world),
      waiter_(world, timeout) {
  TORCH_CHECK_VALUE(world >= 2 && world <= bp::kMaxWorld, "group: the shm transport serves 2 to ",
                    bp::kMaxWorld, " ranks, got ", world);
  // Room for the suffix of grown segments ("_<generation>").
  TORCH_CHECK_VALUE(segment.size() >= 2 && segment.size() + 12 < bp::kNameBytes &&
                        segment[0] == '/' && segment.find('/', 1) == std::string::npos,
                    "segment: expected a POSIX shared-memory name, got '", segment, "'");
  // Whoever fails to join removes the segment: rank 0 may have died after creating it.
  UnlinkOnExit unlink(segment);
  seg_ = rank == 0 ? create_segment(segment, world, kInitialHalfBytes)
                   : open_segment(segment, world, -1, Clock::now() + timeout);
  seg_name_ = segment;
  __atomic_store_n(&seg_.control(rank_)->pid, static_cast<int64_t>(::getpid()), __ATOMIC_RELAXED);
  barrier("joining the workspace");
  // Every rank has mapped it: rank 0 unlinks it now (UnlinkOnExit), the others leave it to rank 0.
  if (rank != 0) unlink.keep();
}

Workspace::~Workspace() {
  // A peer still waiting for this rank (it left between calls, e.g. after an error elsewhere)
  // fails at once instead of after the timeout; nothing is written into a broken workspace.
  if (seg_.base() && broken_.empty() && bp::load_broken(&seg_.header()->broken) == 0) {
    __atomic_store_n(&seg_.control(rank_)->pid, -static_cast<int64_t>(::getpid()),
                     __ATOMIC_RELAXED);
  }
  unlink_segment(seg_name_);
}

std::string Workspace::blame() const {
  const uint32_t word = __atomic_load_n(&seg_.header()->blamed, __ATOMIC_RELAXED);
  const int64_t culprit = bp::blamed_rank(word);
  if (culprit < 0 || culprit >= world_) return "";
  switch (bp::blamed_fault(word)) {
    case bp::Fault::kExited: return c10::str("rank ", culprit, " exited or left the workspace");
    case bp::Fault::kTimedOut:
      return c10::str("rank ", culprit, " did not arrive within ",
                      waiter_.timeout().count() / 1000.0, " s");
    case bp::Fault::kMismatch: return c10::str("rank ", culprit, " made a different call");
    case bp::Fault::kError: return c10::str("rank ", culprit, " failed");
    default: return "";
  }
}

void Workspace::give_up(const Failure& f) {
  broken_ = f.reason;
  if (f.culprit >= 0) {
    // The first rank to blame a peer is the one recorded (like `broken`, rule 6).
    bp::blame(&seg_.header()->blamed, bp::blame_word(f.culprit, f.fault));
    bp::mark_broken(&seg_.header()->broken, static_cast<uint32_t>(rank_));
  }
  unlink_segment(seg_name_);
}

void Workspace::fail(const Failure& f) {
  give_up(f);
  TORCH_CHECK_VALUE(!f.value_error, f.message);
  TORCH_CHECK(false, f.message);
}

Workspace::Failure Workspace::peer_gave_up(const char* what) const {
  const uint32_t by = bp::load_broken(&seg_.header()->broken);
  const std::string culprit = blame();
  const std::string reason =
      c10::str(culprit.empty() ? std::string() : c10::str(culprit, ", so "), "rank ", by - 1,
               " gave up on the workspace (see rank ", by - 1, "'s error)");
  return {reason,
          c10::str("group '", group_, "' (shm transport): ", reason, "; seen during ", what,
                   "; the workspace is broken: call mhc_sp.distributed.init(group) on every rank "
                   "for a new one"),
          -1, bp::Fault::kNone, false};
}

void Workspace::stop_if_broken(const char* what) {
  if (bp::load_broken(&seg_.header()->broken) != 0) fail(peer_gave_up(what));
}

void Workspace::barrier(const char* what) {
  arrive_and_wait(what);
  stop_if_broken(what);
}

void Workspace::arrive_and_wait(const char* what) {
  // A rank that resumes after its peers gave up (e.g. it was stopped) does not even arrive.
  stop_if_broken(what);
  const uint64_t e = ++epoch_;
  Waiter::arrive(seg_.control(rank_), e);
  const WaitResult late = waiter_.wait_for_peers(seg_, rank_, e);
  if (late.stall == Stall::kNone) return;
  if (late.stall == Stall::kGaveUp) fail(peer_gave_up(what));
  const std::string prefix = c10::str("group '", group_, "' (shm transport): rank ", late.peer);
  std::string message;
  bp::Fault fault = bp::Fault::kExited;
  switch (late.stall) {
    case Stall::kNone:
    case Stall::kGaveUp: break;  // returned or failed above
    case Stall::kLeft:
      message = c10::str(prefix, " (pid ", late.pid,
                         ") left the workspace (its group was destroyed or initialised again) "
                         "during ",
                         what, "; the workspace is now broken");
      break;
    case Stall::kExited:
      message = c10::str(prefix, " (pid ", late.pid, ") exited during ", what,
                         "; the workspace is now broken");
      break;
    case Stall::kTimedOut:
      message =
          c10::str(prefix, " did not reach ", what, " within ", waiter_.timeout().count() / 1000.0,
                   " s (the group's timeout); the workspace is now broken");
      fault = bp::Fault::kTimedOut;
      break;
  }
  fail({message, message, late.peer, fault, false});
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
  if (stopped.load(std::memory_order_relaxed)) fail(peer_gave_up(what));
}

void Workspace::check_headers(int64_t half) {
  const auto& ref = *reinterpret_cast<const bp::CallHeader*>(seg_.half(0, half));
  for (int64_t r = 1; r < world_; ++r) {
    const auto& h = *reinterpret_cast<const bp::CallHeader*>(seg_.half(r, half));
    if (bp::same_call(ref, h)) continue;
    const auto [arg, detail] = mismatch(ref, h, r);
    const std::string reason =
        c10::str(arg, ": ranks disagree on ", op_name(static_cast<bp::Op>(ref.op)), ": ", detail);
    fail({reason,
          c10::str(reason, " (group '", group_,
                   "', shm transport: every rank must make the same call; the workspace is now "
                   "broken)"),
          r, bp::Fault::kMismatch, true});
  }
}

void Workspace::grow(int64_t need) {
  const int64_t half = bp::align_up(std::max(need, 2 * seg_.half_bytes()), bp::kPage);
  // Every rank knows the name, so any rank that fails removes the segment (rank 0 may die after
  // creating it); rank 0 also announces it in next_name (rule 7).
  const std::string name = c10::str(name_, "_", generation_ + 1);
  UnlinkOnExit unlink(name);
  Segment next;
  if (rank_ == 0) {
    std::memset(seg_.header()->next_name, 0, bp::kNameBytes);
    std::memcpy(seg_.header()->next_name, name.data(), name.size());
    try {
      next = create_segment(name, world_, half);
    } catch (const c10::Error& e) {
      const std::string message =
          c10::str("group '", group_, "' (shm transport): cannot grow the workspace to ", half,
                   " bytes per rank and half: ", e.what_without_backtrace());
      fail({message, message, rank_, bp::Fault::kError, false});
    }
  }
  barrier("growing the workspace");
  if (rank_ != 0) {
    const auto* raw = seg_.header()->next_name;
    const std::string announced(raw, strnlen(raw, bp::kNameBytes));
    try {
      TORCH_CHECK(announced == name, "rank 0 announced segment '", announced, "', expected '", name,
                  "'");
      next = open_segment(name, world_, half, Clock::now() + waiter_.timeout());
    } catch (const c10::Error& e) {
      const std::string message = c10::str(
          "group '", group_,
          "' (shm transport): cannot map the grown workspace: ", e.what_without_backtrace());
      fail({message, message, rank_, bp::Fault::kError, false});
    }
  }
  __atomic_store_n(&next.control(rank_)->pid, static_cast<int64_t>(::getpid()), __ATOMIC_RELAXED);
  barrier("growing the workspace");
  seg_ = std::move(next);
  seg_name_ = name;
  ++generation_;
  epoch_ = 0;
  // Every rank has mapped it: rank 0 unlinks it now (UnlinkOnExit), the others leave it to rank 0.
  if (rank_ != 0) unlink.keep();
}

Call Workspace::start(bp::Op op, uint32_t flags, int64_t rows, int64_t num_tokens, int64_t inner,
                      at::ScalarType dtype) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!broken_.empty()) {
    fail({broken_,
          c10::str("group '", group_,
                   "' (shm transport): the workspace is broken by an earlier error (", broken_,
                   "); call mhc_sp.distributed.init(group) on every rank for a new one"),
          -1, bp::Fault::kNone, false});
  }
  stop_if_broken(op_name(op));
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
    stop_if_broken(op_name(op));
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
  // Nothing to raise from a destructor: the failure is recorded, and the peers see the mark.
  ws_.give_up({c10::str("rank ", rank_, " abandoned ", op_name(static_cast<bp::Op>(header_.op)),
                        " after an error"),
               "", rank_, bp::Fault::kError, false});
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
  ws_.stop_if_broken(what);
}

void Call::barrier() { ws_.barrier(op_name(static_cast<bp::Op>(header_.op))); }

}  // namespace mhc_sp::shm
