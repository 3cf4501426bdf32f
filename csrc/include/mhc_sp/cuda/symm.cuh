// SPDX-License-Identifier: Apache-2.0
#pragma once
// Device side of the symmetric-memory boundary (layout and rules: mhc_sp/symm.h). Every kernel
// here takes R per-rank argument sets (a __grid_constant__ struct) and runs rank blockIdx.y's:
// production launches R = 1, gridDim.y = 1 (this process's rank); the single-GPU harness R = tp
// in one cooperative launch, each simulated rank with its own buffers and pointer table. Same code.
//
// Progress. Blocks wait for blocks of other ranks (mailbox polls, barriers), so every launch is
// capped to blocks that are resident together (the launcher asks the occupancy calculator; the
// harness launches cooperatively, which fails rather than oversubscribe). Blocks push everything
// they owe before they wait for anything, so the waits form no cycle.
//
// Memory ordering (the single-GPU harness shares one L2 and cannot catch scope bugs, so each
// choice is argued here):
//  - Barrier data (landing rows, headers, published `out` rows) is written with ordinary stores by
//    every thread of a block; __syncthreads() then orders those stores before thread p's
//    st.release.sys of the epoch into rank p's flag word (bar.sync makes the block's stores
//    precede the release in causality order, and a release is cumulative). The waiting thread's
//    ld.acquire.sys that reads the epoch synchronizes with it, and the __syncthreads_or() after the
//    wait (a bar.sync with a reduction) extends that to every thread of the waiting block, whose
//    loads of the data follow. System scope because the writer and the reader are different GPUs
//    (or, for the flags of the harness, different blocks of one). Data loads after the barrier use
//    ld.global.cg (L2), never the non-coherent read-only path.
//  - Lamport data is its own signal. Pushes are st.relaxed.sys (16 bytes), polls ld.relaxed.sys;
//    a torn read can only show some lanes still -0, which reads as "not arrived". The poller
//    re-arms each vector right after consuming it (the tags: the call's last block, once every
//    block has checked them). The next write to that vector is the same source's push three calls
//    later, which needs this rank's push of two calls later, which is issued after this kernel
//    ends; every Lamport kernel starts with fence.acq_rel.sys in each pushing thread, so the
//    re-arming stores are ordered before the pushes that let a peer proceed, and the peer's own
//    fence orders its observation before its next pushes.
//  - Call counters and epochs are device-local (ordinary memory, this GPU only): read at kernel
//    start, advanced by the last block to finish (atomic counter + __threadfence, gpu scope);
//    the next kernel in the stream sees them.
//
// Failures (rule 6 of mhc_sp/boundary_protocol.h). A wait that fails records the error, marks
// every rank's buffer broken and poisons what the failing block would have produced (NaN); every
// other waiter sees the broken word within 64 polls and does the same. A kernel that starts on a
// broken workspace records kPeerBroken (naming the rank that broke it), reads and pushes nothing,
// and fills its outputs with NaN. So every output element of a failed call is either what a good
// call would have produced or NaN, never a stale or uninitialised value, eager or replayed; the
// next eager op on the group raises (SymmWorkspace::check).
//
// Index arithmetic. Copy loops walk rows and 16-byte vectors by addition (RowWalk), and loops that
// stride by the grid stay rolled (#pragma unroll 1): unrolling one needs its trip count, a 64-bit
// division. Nothing here keeps an array in local memory (tests/test_cubins.py checks the cubins).

#include <cuda_runtime.h>

#include "mhc_sp/cuda/pre.cuh"
#include "mhc_sp/symm.h"

namespace mhc_sp::cuda {

using symm::BufferLayout;
using symm::CallHeader;
using symm::ErrorRecord;
using symm::ExchangeLayout;
using symm::LamportTag;
using symm::LocalState;

// ---- primitives ---------------------------------------------------------------------------------

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void fence_acq_rel_sys() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

// Programmatic dependent launch (sm_90+): the dependent kernel waits here until the kernel before
// it has completed and its memory is visible; that kernel lets the dependent's blocks be scheduled
// early (they then sit in the wait) once each of its blocks has executed the trigger.
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void trigger_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Lamport vectors: V bf16 values moved as one relaxed system-scope access.
template <int V>
struct Mail;

template <>
struct Mail<8> {
  uint4 u;
  __device__ __forceinline__ static Mail load(const void* p) {
    Mail m;
    asm volatile("ld.relaxed.sys.global.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(m.u.x), "=r"(m.u.y), "=r"(m.u.z), "=r"(m.u.w)
                 : "l"(p)
                 : "memory");
    return m;
  }
  __device__ __forceinline__ void store(void* p) const {
    asm volatile("st.relaxed.sys.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u.x),
                 "r"(u.y), "r"(u.z), "r"(u.w)
                 : "memory");
  }
  __device__ __forceinline__ static Mail of(const Pack<8>& p) { return Mail{p.u}; }
  __device__ __forceinline__ static Mail of(const LamportTag& t) {
    const auto w = [&](int k) {
      return uint32_t(t.lane[2 * k]) | (uint32_t(t.lane[2 * k + 1]) << 16);
    };
    return Mail{make_uint4(w(0), w(1), w(2), w(3))};
  }
  __device__ __forceinline__ static Mail armed() {
    const uint32_t w = uint32_t(symm::kNegZeroBits) * 0x10001u;
    return Mail{make_uint4(w, w, w, w)};
  }
  __device__ __forceinline__ static bool lane_armed(uint32_t w) {
    return (w & 0xffffu) == symm::kNegZeroBits || (w >> 16) == symm::kNegZeroBits;
  }
  __device__ __forceinline__ bool any_armed() const {
    return lane_armed(u.x) || lane_armed(u.y) || lane_armed(u.z) || lane_armed(u.w);
  }
  __device__ __forceinline__ bool operator==(const Mail& o) const {
    return u.x == o.u.x && u.y == o.u.y && u.z == o.u.z && u.w == o.u.w;
  }
  // -0 is the "empty" marker: send it as +0 (equal in every sum).
  __device__ __forceinline__ static uint32_t clear_lane(uint32_t w) {
    if ((w & 0xffffu) == symm::kNegZeroBits) w &= 0xffff0000u;
    if ((w >> 16) == symm::kNegZeroBits) w &= 0x0000ffffu;
    return w;
  }
  __device__ __forceinline__ Mail sendable() const {
    return Mail{make_uint4(clear_lane(u.x), clear_lane(u.y), clear_lane(u.z), clear_lane(u.w))};
  }
  __device__ __forceinline__ void add_to(float (&acc)[8]) const {
    float f[8];
    Pack<8>{u}.to_float(f);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += f[e];
  }
};

template <>
struct Mail<1> {
  uint16_t u;
  __device__ __forceinline__ static Mail load(const void* p) {
    Mail m;
    asm volatile("ld.relaxed.sys.global.b16 %0, [%1];" : "=h"(m.u) : "l"(p) : "memory");
    return m;
  }
  __device__ __forceinline__ void store(void* p) const {
    asm volatile("st.relaxed.sys.global.b16 [%0], %1;" ::"l"(p), "h"(u) : "memory");
  }
  __device__ __forceinline__ static Mail of(const Pack<1>& p) { return Mail{p.u}; }
  __device__ __forceinline__ static Mail armed() { return Mail{symm::kNegZeroBits}; }
  __device__ __forceinline__ bool any_armed() const { return u == symm::kNegZeroBits; }
  __device__ __forceinline__ Mail sendable() const {
    return Mail{u == symm::kNegZeroBits ? uint16_t(0) : u};
  }
  __device__ __forceinline__ void add_to(float (&acc)[1]) const { acc[0] += bf16_bits_to_float(u); }
};

template <int V>
__device__ __forceinline__ void fill_nan(float (&v)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) v[e] = __int_as_float(0x7fc00000);
}

// Fills this block's share (one of gridDim.x) of the `bytes` bytes at p (16-byte aligned) with
// all-ones bytes: NaN in every floating-point format (-1 in integer ones).
__device__ __forceinline__ void poison_share(void* p, int64_t bytes) {
  if (p == nullptr || bytes <= 0) return;
  const uint4 ones = make_uint4(~0u, ~0u, ~0u, ~0u);
  const int64_t vecs = bytes / 16, stride = int64_t(gridDim.x) * blockDim.x;
#pragma unroll 1
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vecs; v += stride) {
    static_cast<uint4*>(p)[v] = ones;
  }
  if (blockIdx.x == 0 && threadIdx.x < bytes - vecs * 16) {
    static_cast<uint8_t*>(p)[vecs * 16 + threadIdx.x] = 0xff;
  }
}

// ---- one rank's view ---------------------------------------------------------------------------

// What a kernel knows about one rank of a group. `peers` is the pointer table (device memory):
// peers[p] is rank p's buffer as mapped here, peers[rank] this rank's own.
struct SymmRank {
  uint8_t* const* peers;
  int rank, world;
  LocalState* state;   // device-local
  ErrorRecord* error;  // host-mapped
  uint64_t timeout_ns;
  BufferLayout L;
  int absent;  // harness only: this simulated rank never arrives (never set in production)
};

__device__ __forceinline__ uint8_t* own_buffer(const SymmRank& s) { return s.peers[s.rank]; }

__device__ __forceinline__ uint32_t* broken_word(uint8_t* buffer) {
  return &reinterpret_cast<boundary::SegmentHeader*>(buffer)->broken;
}

// Fills this rank's error record once (the first failing thread wins).
__device__ __forceinline__ void record_error(const SymmRank& s, uint32_t code, int peer, int block,
                                             uint32_t op, uint32_t phase, uint64_t epoch,
                                             uint64_t waited_ns) {
  if (atomicCAS(&s.state->error_claim, 0u, 1u) != 0u) return;
  volatile ErrorRecord* e = s.error;
  e->rank = s.rank;
  e->peer = peer;
  e->block = block;
  e->op = op;
  e->phase = phase;
  e->epoch = epoch;
  e->waited_ns = waited_ns;
  __threadfence_system();  // the fields reach host memory before the code that announces them
  e->code = code;
  __threadfence_system();
}

// Marks every rank's buffer broken (this rank recorded first), so that every waiter of every rank
// gives up at once instead of waiting out its own timeout.
__device__ __forceinline__ void break_workspace(const SymmRank& s) {
  for (int p = 0; p < s.world; ++p) boundary::mark_broken(broken_word(s.peers[p]), s.rank);
}

// Where a wait happens, for the error record.
struct WaitSite {
  int peer, block;
  uint32_t op, phase;
  uint64_t epoch;
};

// Spins until ready() holds. false: the group's timeout passed (the workspace is then marked
// broken) or another rank had marked it broken; either way the error is recorded.
template <class Ready>
__device__ __forceinline__ bool wait_until(const SymmRank& s, const WaitSite& w, Ready&& ready) {
  if (ready()) return true;
  const uint64_t t0 = globaltimer_ns();
  for (uint32_t spin = 1;; ++spin) {
    if (ready()) return true;
    if ((spin & 63u) == 0u) {
      const uint32_t broken = boundary::load_broken(broken_word(own_buffer(s)));
      if (broken != 0) {
        record_error(s, symm::kPeerBroken, static_cast<int>(broken) - 1, w.block, w.op, w.phase,
                     w.epoch, globaltimer_ns() - t0);
        return false;
      }
      const uint64_t waited = globaltimer_ns() - t0;
      if (waited > s.timeout_ns) {
        record_error(s, symm::kTimeout, w.peer, w.block, w.op, w.phase, w.epoch, waited);
        break_workspace(s);
        return false;
      }
    }
  }
}

// Whether the call must be refused because the workspace is already broken: the same answer for
// the whole block (one load, shared). Block 0 records kPeerBroken, naming the rank that broke it.
__device__ __forceinline__ bool refused(const SymmRank& s, uint32_t op, uint64_t call) {
  __shared__ uint32_t broken;
  if (threadIdx.x == 0) broken = boundary::load_broken(broken_word(own_buffer(s)));
  __syncthreads();
  const uint32_t b = broken;
  __syncthreads();  // `broken` may be reused by the next call of this function
  if (b != 0 && blockIdx.x == 0 && threadIdx.x == 0) {
    record_error(s, symm::kPeerBroken, static_cast<int>(b) - 1, 0, op, symm::kPhaseStart, call, 0);
  }
  return b != 0;
}

// Whether rank p's header of the call, in this rank's half, equals `mine` (rule 4's fields; the
// epoch is 0 on both sides, see header_of_call). Read as four 16-byte words and compared field by
// field, so nothing is copied to local memory.
__device__ __forceinline__ uint64_t u64_of(uint32_t lo, uint32_t hi) {
  return (uint64_t(hi) << 32) | lo;
}

__device__ __forceinline__ bool header_matches(const CallHeader& mine, const uint8_t* half, int p) {
  static_assert(offsetof(CallHeader, op) == 0 && offsetof(CallHeader, flags) == 4 &&
                    offsetof(CallHeader, rows) == 8 && offsetof(CallHeader, num_tokens) == 16 &&
                    offsetof(CallHeader, inner) == 24 && offsetof(CallHeader, dtype) == 32 &&
                    offsetof(CallHeader, elem_bytes) == 36 && offsetof(CallHeader, call) == 40 &&
                    offsetof(CallHeader, epoch) == 48,
                "the header's fields sit in its first four 16-byte words");
  const auto* src = reinterpret_cast<const uint4*>(half + symm::header_offset(p));
  const uint4 w0 = __ldcg(src), w1 = __ldcg(src + 1), w2 = __ldcg(src + 2), w3 = __ldcg(src + 3);
  return w0.x == mine.op && w0.y == mine.flags && u64_of(w0.z, w0.w) == uint64_t(mine.rows) &&
         u64_of(w1.x, w1.y) == uint64_t(mine.num_tokens) &&
         u64_of(w1.z, w1.w) == uint64_t(mine.inner) && w2.x == mine.dtype &&
         w2.y == mine.elem_bytes && u64_of(w2.z, w2.w) == mine.call &&
         u64_of(w3.x, w3.y) == mine.epoch;
}

// The block barrier of rule 3, per block index: block `block` of every rank stores `epoch` into
// its word of every peer's flags (release, system scope), then waits for every peer's word in its
// own buffer to reach it (acquire). Thread p < world talks to rank p. With `check_half` set, the
// same thread then compares rank p's header of the call (which p's block wrote before its release,
// at header_offset(p) of this rank's half) with `mine` (rule 4): every block checks every peer
// before it reads a row that peer pushed. true when every peer arrived with the same call;
// otherwise the error is recorded and the workspace broken.
__device__ __forceinline__ bool block_barrier(const SymmRank& s, int block, uint64_t epoch,
                                              uint32_t op, uint32_t phase, const CallHeader& mine,
                                              const uint8_t* check_half) {
  __syncthreads();  // the block's stores precede the releases below
  bool failed = false;
  const int p = threadIdx.x;
  if (p < s.world) {
    auto* theirs = reinterpret_cast<uint64_t*>(s.peers[p] + symm::flag_offset(s.L, block, s.rank));
    boundary::store_release(theirs, epoch);
    const auto* flag =
        reinterpret_cast<const uint64_t*>(own_buffer(s) + symm::flag_offset(s.L, block, p));
    const WaitSite site{p, block, op, phase, epoch};
    if (!wait_until(s, site, [&] { return boundary::load_acquire(flag) >= epoch; })) {
      failed = true;
    } else if (check_half != nullptr && !header_matches(mine, check_half, p)) {
      record_error(s, symm::kMismatch, p, block, op, phase, epoch, 0);
      break_workspace(s);
      failed = true;
    }
  }
  // A barrier with a reduction: extends each acquire to the whole block, and every thread learns
  // the outcome from its own register (no shared flag a lagging warp could read too late).
  return __syncthreads_or(failed) == 0;
}

// The calling block's next barrier epoch (epochs only grow; read by all, written back by thread 0
// in end_epochs once the block is done with this kernel's barriers).
__device__ __forceinline__ uint64_t block_epoch(const SymmRank& s, int block) {
  return *reinterpret_cast<volatile uint64_t*>(&s.state->epochs[block]);
}

__device__ __forceinline__ void set_block_epoch(const SymmRank& s, int block, uint64_t epoch) {
  if (threadIdx.x == 0) s.state->epochs[block] = epoch;
}

// A call counter's value for this kernel, the same for every block (advanced only by the last
// block of the call's final kernel, after every block has read it).
__device__ __forceinline__ uint64_t read_call(const uint64_t* counter) {
  return *reinterpret_cast<const volatile uint64_t*>(counter);
}

// The call's end: the last block to get here runs last() (thread 0) and advances the counter.
template <class Last>
__device__ __forceinline__ void end_call(uint32_t* done, uint64_t* calls, Last&& last) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(done, 1u) == gridDim.x - 1) {
      last();
      *done = 0;
      *calls += 1;
      __threadfence();
    }
  }
}

__device__ __forceinline__ void end_call(uint32_t* done, uint64_t* calls) {
  end_call(done, calls, [] {});
}

__device__ __forceinline__ uint8_t* half_base(const SymmRank& s, uint8_t* buffer, uint64_t call) {
  return buffer + symm::half_offset(s.L, symm::half_index(call));
}

// ---- Lamport mailbox ----------------------------------------------------------------------------

// x for project_block: the fp32 sum, in rank order, of every rank's mailbox slot, rounded once
// to bf16 (so every rank gets the same bits); waits per vector and re-arms what it consumed. When
// the call was refused or a source's tag disagreed (`ok` false, the same in the whole block), x is
// NaN and no slot is read; when a wait fails, that vector is NaN.
struct LamportX {
  uint8_t* mailbox;  // this rank's mailbox of the call: source p at mailbox + p * slot_bytes
  int64_t slot_bytes;
  const SymmRank* s;
  int block;
  uint64_t call;
  bool ok;

  template <int V>
  __device__ __forceinline__ void load(const PreArgs& a, int64_t t, int64_t h,
                                       float (&xv)[V]) const {
    sum<V>(t * a.H + h, xv);
  }

  // xv = bf16(sum_p slot_p[e]) for the V elements at element offset e of every slot.
  template <int V>
  __device__ __forceinline__ void sum(int64_t e, float (&xv)[V]) const {
    if (!ok) return fill_nan(xv);
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.f;
    bool arrived = true;
    for (int p = 0; p < s->world; ++p) {
      uint8_t* at = mailbox + p * slot_bytes + e * 2;
      Mail<V> m = Mail<V>::load(at);
      if (m.any_armed()) {
        const WaitSite site{p, block, static_cast<uint32_t>(boundary::Op::kAllReduce),
                            symm::kPhaseMailbox, call};
        if (!wait_until(*s, site, [&] {
              m = Mail<V>::load(at);
              return !m.any_armed();
            })) {
          arrived = false;  // recorded; the vector is void
          continue;
        }
      }
      m.add_to(acc);
      Mail<V>::armed().store(at);
    }
    if (!arrived) return fill_nan(xv);
    Pack<V>::from_float(acc).to_float(xv);  // one rounding to bf16
  }
};

// Pushes columns [h0, h1) of rows [0, rows) of `src` (bf16, row stride ld; h0, h1 multiples of
// V) into slot [rank] of every peer's mailbox `mailbox` (same element offsets), starting with the
// next rank so that the ranks do not all hit the same peer first.
template <int V>
__device__ __forceinline__ void lamport_push(const SymmRank& s, int64_t mailbox,
                                             const uint16_t* src, int64_t ld, int64_t rows,
                                             int64_t h0, int64_t h1) {
  const int per_row = static_cast<int>((h1 - h0) / V);
  for (int k = 1; k <= s.world; ++k) {
    const int q = (s.rank + k) % s.world;
    uint8_t* dst = s.peers[q] + symm::mailbox_slot_offset(s.L, mailbox, s.rank);
    for (RowWalk w(threadIdx.x, per_row, blockDim.x); w.row < rows; w.next()) {
      const int64_t e = w.row * ld + h0 + int64_t(w.col) * V;
      Mail<V>::of(Pack<V>::load(src + e)).sendable().store(dst + e * 2);
    }
  }
}

// Block 0 pushes this rank's tag of the call into its slot of every peer's mailbox (thread q to
// rank q), before it waits for anything.
__device__ __forceinline__ void push_lamport_tag(const SymmRank& s, int64_t mailbox,
                                                 const LamportTag& tag) {
  if (blockIdx.x != 0 || threadIdx.x >= s.world) return;
  Mail<8>::of(tag).store(s.peers[threadIdx.x] + symm::lamport_tag_offset(s.L, mailbox, s.rank));
}

// Every block, before it reads a source's rows: thread p waits for source p's tag and compares it
// with this rank's. true (the whole block) when every source made the same call; otherwise the
// error is recorded and the workspace broken. The tags are re-armed by the call's last block.
__device__ __forceinline__ bool lamport_tags_match(const SymmRank& s, int64_t mailbox,
                                                   const LamportTag& tag, uint32_t op,
                                                   uint64_t call) {
  bool failed = false;
  const int p = threadIdx.x;
  if (p < s.world) {
    const uint8_t* at = own_buffer(s) + symm::lamport_tag_offset(s.L, mailbox, p);
    Mail<8> m = Mail<8>::load(at);
    const WaitSite site{p, static_cast<int>(blockIdx.x), op, symm::kPhaseMailbox, call};
    if (!wait_until(s, site, [&] {
          m = Mail<8>::load(at);
          return !m.any_armed();
        })) {
      failed = true;
    } else if (!(m == Mail<8>::of(tag))) {
      record_error(s, symm::kMismatch, p, static_cast<int>(blockIdx.x), op, symm::kPhaseMailbox,
                   call, 0);
      break_workspace(s);
      failed = true;
    }
  }
  return __syncthreads_or(failed) == 0;
}

// The start of a Lamport call, the same in every block: refused on a broken workspace; otherwise
// this rank's tag and (push()) its rows go into every peer's mailbox before anything is awaited,
// then every source's tag is checked. true: the block may read the mailbox.
template <class Push>
__device__ __forceinline__ bool lamport_start(const SymmRank& s, uint32_t op, int64_t mailbox,
                                              const LamportTag& tag, uint64_t call, Push&& push) {
  if (refused(s, op, call)) return false;
  fence_acq_rel_sys();
  push_lamport_tag(s, mailbox, tag);
  push();
  return lamport_tags_match(s, mailbox, tag, op, call);
}

// x from this rank's mailbox of the call (NaN when the call did not start: see LamportX).
__device__ __forceinline__ LamportX lamport_x(const SymmRank& s, int64_t mailbox, uint64_t call,
                                              bool ok) {
  return LamportX{own_buffer(s) + symm::mailbox_slot_offset(s.L, mailbox, 0),
                  s.L.mailbox_slot_bytes,
                  &s,
                  static_cast<int>(blockIdx.x),
                  call,
                  ok};
}

// The last block of a Lamport call re-arms every source's tag in this rank's mailbox of the call.
__device__ __forceinline__ void rearm_lamport_tags(const SymmRank& s, int64_t mailbox) {
  for (int p = 0; p < s.world; ++p) {
    Mail<8>::armed().store(own_buffer(s) + symm::lamport_tag_offset(s.L, mailbox, p));
  }
}

// ---- the replicated (decode) boundary: all-reduce + post + pre in one kernel ------------------

// The projection kernels here carry a rank's exchange state beside project_block's registers:
// target two blocks per SM (plan_pre's aim), so that ptxas keeps all of it in registers.
constexpr int kSymmProjMinBlocks = 2;

struct LamportLayerRank {
  SymmRank s;
  PreArgs pre;              // PostPre: x unused (it comes from the mailbox)
  const uint16_t* partial;  // (T, H)
  int64_t items;            // plan_pre's work items (one token tile for T <= kLamportMaxTokens)
};

template <int kRanks>
struct LamportLayerParams {
  LamportLayerRank r[kRanks];
};

// A refused or mismatched call still runs the post and the projection, on x = NaN (LamportX), so
// that residual_out, post, comb and layer_input all come out NaN through the one code path.
template <int N, int V, int kRanks>
__global__ void __launch_bounds__(kProjThreads, kSymmProjMinBlocks)
    symm_lamport_layer_kernel(const __grid_constant__ LamportLayerParams<kRanks> P) {
  const LamportLayerRank& R = P.r[blockIdx.y];  // grid-constant: no per-thread copy
  const SymmRank& s = R.s;
  if (s.absent) return;
  using S = PreShape<N, Mode::PostPre>;
  constexpr uint32_t kOp = static_cast<uint32_t>(boundary::Op::kFusedLayer);
  const PreArgs& a = R.pre;
  const uint64_t call = read_call(&s.state->lamport_calls);
  const int64_t mailbox = symm::mailbox_index(call);
  const LamportTag tag = symm::lamport_tag(boundary::Op::kFusedLayer, a.T, a.H, call);
  const bool ok = lamport_start(s, kOp, mailbox, tag, call, [&] {
  // This block's items: all T rows of their H-slices.
#pragma unroll 1
    for (int64_t item = blockIdx.x; item < R.items; item += gridDim.x) {
      const int split = static_cast<int>(item) % a.splits;
      const int64_t h0 = int64_t(split) * a.chunks_per_split * S::HC;
      const int64_t h1 = min(a.H, h0 + int64_t(a.chunks_per_split) * S::HC);
      lamport_push<V>(s, mailbox, R.partial, a.H, a.T, h0, h1);
    }
  });
  const LamportX xs = lamport_x(s, mailbox, call, ok);
  bool finish = false;  // one token tile: the block that completes it runs the finish
#pragma unroll 1
  for (int64_t item = blockIdx.x; item < R.items; item += gridDim.x) {
    finish |= project_block<N, Mode::PostPre, V>(a, true, item, xs);
  }
  if (finish) fused_finish<N, Mode::PostPre, V>(a, 0);
  end_call(&s.state->lamport_done, &s.state->lamport_calls,
           [&] { rearm_lamport_tags(s, mailbox); });
}

// ---- plain all-reduce through the mailbox ------------------------------------------------------

struct LamportSumRank {
  SymmRank s;
  const uint16_t* in;  // numel bf16
  uint16_t* out;
  int64_t numel;
};

template <int kRanks>
struct LamportSumParams {
  LamportSumRank r[kRanks];
};

constexpr int kCopyThreads = 256;
constexpr int kCopyMinBlocks = 1;  // no occupancy target: ptxas would trade spills for one
constexpr int64_t kSpanBytes = int64_t(kCopyThreads) * 16;  // one 16-byte vector per thread

template <int kRanks>
__global__ void __launch_bounds__(kCopyThreads, kCopyMinBlocks)
    symm_lamport_sum_kernel(const __grid_constant__ LamportSumParams<kRanks> P) {
  constexpr int V = 8;
  constexpr uint32_t kOp = static_cast<uint32_t>(boundary::Op::kAllReduce);
  const LamportSumRank& R = P.r[blockIdx.y];
  const SymmRank& s = R.s;
  if (s.absent) return;
  const uint64_t call = read_call(&s.state->lamport_calls);
  const int64_t mailbox = symm::mailbox_index(call);
  const LamportTag tag = symm::lamport_tag(boundary::Op::kAllReduce, R.numel, 1, call);
  const int64_t span = int64_t(kCopyThreads) * V;
  const bool ok = lamport_start(s, kOp, mailbox, tag, call, [&] {
#pragma unroll 1
    for (int64_t e0 = int64_t(blockIdx.x) * span; e0 < R.numel; e0 += int64_t(gridDim.x) * span) {
      lamport_push<V>(s, mailbox, R.in, 0, 1, e0, min(e0 + span, R.numel));
    }
  });
  const LamportX xs = lamport_x(s, mailbox, call, ok);
#pragma unroll 1
  for (int64_t e0 = int64_t(blockIdx.x) * span; e0 < R.numel; e0 += int64_t(gridDim.x) * span) {
    const int64_t e = e0 + int64_t(threadIdx.x) * V;
    if (e < R.numel) {
      float x[V];
      xs.sum<V>(e, x);
      Pack<V>::from_float(x).store(R.out + e);
    }
  }
  end_call(&s.state->lamport_done, &s.state->lamport_calls,
           [&] { rearm_lamport_tags(s, mailbox); });
}

// ---- barrier exchanges -------------------------------------------------------------------------

// One rank's part of a barrier-exchanged call (the half and layout of exchange_layout).
struct ExchangeRank {
  SymmRank s;
  CallHeader header;  // this rank's header of the call (`call` filled in on the device)
  ExchangeLayout X;
  int64_t rows;   // rows of the caller's input (partial / x)
  int64_t valid;  // real rows of this rank's shard (shard_valid_rows)
};

// This rank's header of call `call`. Its epoch is 0: every block writes the header into the same
// slot, and each block has its own barrier epochs (the call number already tells calls apart).
__device__ __forceinline__ CallHeader header_of_call(const ExchangeRank& E, uint64_t call) {
  CallHeader h = E.header;
  h.call = call;
  h.epoch = 0;
  return h;
}

// Every block writes this rank's header into headers[rank] of every peer's half (thread p to rank
// p; the same bytes from every block), so that each block's own barrier orders it before the peer's
// check.
__device__ __forceinline__ void push_header(const ExchangeRank& E, const CallHeader& h,
                                            uint64_t call) {
  if (threadIdx.x >= E.s.world) return;
  *reinterpret_cast<CallHeader*>(half_base(E.s, E.s.peers[threadIdx.x], call) +
                                 symm::header_offset(E.s.rank)) = h;
}

// Row r of source p's landing area in this rank's half.
__device__ __forceinline__ const uint16_t* landing_row(const ExchangeRank& E, const uint8_t* half,
                                                       int p, int64_t r) {
  return reinterpret_cast<const uint16_t*>(half + E.X.landing_offset + p * E.X.landing_stride +
                                           r * E.X.row_bytes);
}

// Copies the rows of this rank's `src` ((rows, inner) bf16) that owner q's shard rows [r0, r1)
// cover, elements [h0, h1) of each, into q's landing area (slot [rank]) of `call`'s half. Rows at
// or past `rows` are padding: nothing is sent, the owner reads zeros.
template <int V>
__device__ __forceinline__ void push_shard_rows(const ExchangeRank& E, uint64_t call,
                                                const uint16_t* src, int64_t inner, int64_t r0,
                                                int64_t r1, int64_t h0, int64_t h1) {
  const int64_t shard = E.X.in_rows;
  const int per_row = static_cast<int>((h1 - h0 + V - 1) / V);
  for (int k = 1; k <= E.s.world; ++k) {
    const int q = (E.s.rank + k) % E.s.world;
    const int64_t end = min(r1, E.rows - q * shard);  // rows of q's shard this rank holds
    if (end <= r0) continue;
    uint8_t* half = half_base(E.s, E.s.peers[q], call);
    for (RowWalk w(threadIdx.x, per_row, blockDim.x); r0 + w.row < end; w.next()) {
      const int64_t r = r0 + w.row, h = h0 + int64_t(w.col) * V;
      const Pack<V> v = Pack<V>::load(src + (q * shard + r) * inner + h);
      v.store(const_cast<uint16_t*>(landing_row(E, half, E.s.rank, r)) + h);
    }
  }
}

// x for project_block in the sharded boundary: the fp32 rank-order sum of the landed rows, rounded
// once to bf16; padding rows (past `valid`) are zeros. NaN when the block's first barrier or header
// check failed (`ok` false): then no landed row is read.
struct LandingX {
  const ExchangeRank* E;
  const uint8_t* half;
  bool ok;

  template <int V>
  __device__ __forceinline__ void load(const PreArgs& a, int64_t t, int64_t h,
                                       float (&xv)[V]) const {
    if (!ok) return fill_nan(xv);
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.f;
    if (t < E->valid) {
      for (int p = 0; p < E->s.world; ++p) {
        float f[V];
        Pack<V>::load_l2(landing_row(*E, half, p, t) + h).to_float(f);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += f[k];
      }
    }
    Pack<V>::from_float(acc).to_float(xv);
  }
};

struct ShardedLayerRank {
  ExchangeRank e;
  PreArgs pre;              // PostPre over the shard (T = shard rows); pre.out is replaced
  const uint16_t* partial;  // (rows, H)
  uint16_t* gathered;       // (num_tokens, H): the fresh layer_input
  int64_t items;            // plan_pre's work items over the shard
};

template <int kRanks>
struct ShardedLayerParams {
  ShardedLayerRank r[kRanks];
};

// Kernel A: push-reduce-scatter, barrier and header check, then the post (x summed on the fly) and
// the projection of the shard; the partial sums go to pre.ws for kernel B. Refused: nothing (B
// fills the call's outputs with NaN).
template <int N, int V, int kRanks>
__global__ void __launch_bounds__(kProjThreads, kSymmProjMinBlocks)
    symm_sharded_layer_kernel(const __grid_constant__ ShardedLayerParams<kRanks> P) {
  const ShardedLayerRank& R = P.r[blockIdx.y];
  const ExchangeRank& E = R.e;
  if (E.s.absent) return;
  using S = PreShape<N, Mode::PostPre>;
  const PreArgs& a = R.pre;
  const int block = blockIdx.x;
  const uint64_t call = read_call(&E.s.state->exchange_calls);
  if (refused(E.s, E.header.op, call)) return;
  const uint64_t epoch = block_epoch(E.s, block) + 1;
  const CallHeader mine = header_of_call(E, call);
  push_header(E, mine, call);
#pragma unroll 1
  for (int64_t item = block; item < R.items; item += gridDim.x) {
    const int tile = static_cast<int>(item) / a.splits, split = static_cast<int>(item) % a.splits;
    const int64_t h0 = int64_t(split) * a.chunks_per_split * S::HC;
    const int64_t h1 = min(a.H, h0 + int64_t(a.chunks_per_split) * S::HC);
    const int64_t r0 = int64_t(tile) * kTileTokens, r1 = min(a.T, r0 + kTileTokens);
    push_shard_rows<V>(E, call, R.partial, a.H, r0, r1, h0, h1);
  }
  uint8_t* half = half_base(E.s, own_buffer(E.s), call);
  const bool ok = block_barrier(E.s, block, epoch, E.header.op, symm::kPhaseFirst, mine, half);
  set_block_epoch(E.s, block, epoch);
  // What is left is this rank's own projection, and B's first step waits for all of A: B's blocks
  // may be scheduled now, so that its launch overlaps the projection instead of following it.
  trigger_dependent_grid();
  const LandingX xs{&E, half, ok};
#pragma unroll 1
  for (int64_t item = block; item < R.items; item += gridDim.x) {
    project_block<N, Mode::PostPre, V>(a, false, item, xs);
  }
}

// Kernel B (a programmatic dependent of A in production): the finish (Sinkhorn, collapse, RMSNorm)
// of the shard's real rows into this rank's published `out` rows, zeros for the padding rows'
// post, comb and residual_out, barrier, then pull every rank's rows into the gathered output. On
// a broken workspace (A failed here, or a peer broke it) every output of the call is NaN; a block
// whose barrier fails fills the gathered rows it would have pulled with NaN.
template <int N, int V, int kRanks>
__global__ void __launch_bounds__(kFinishThreads)
    symm_sharded_finish_kernel(const __grid_constant__ ShardedLayerParams<kRanks> P) {
  wait_for_prerequisite_grid();  // kernel A's partial sums, residual_out and epochs are complete
  const ShardedLayerRank& R = P.r[blockIdx.y];
  const ExchangeRank& E = R.e;
  if (E.s.absent) return;
  using S = PreShape<N, Mode::PostPre>;
  __shared__ float mix_s[kFinishTokens * S::MP1];
  __shared__ float pre_s[kFinishTokens * N];
  __shared__ float red[32];
  const int block = blockIdx.x;
  const uint64_t call = read_call(&E.s.state->exchange_calls);
  const int64_t shard = R.pre.T, H = R.pre.H;
  if (refused(E.s, E.header.op, call)) {
    poison_share(R.pre.stream_out, shard * N * H * 2);
    poison_share(R.pre.post, shard * N * 4);
    poison_share(R.pre.comb, shard * N * N * 4);
    poison_share(R.gathered, E.header.num_tokens * H * 2);
    return;
  }
  uint8_t* half = half_base(E.s, own_buffer(E.s), call);
  PreArgs a = R.pre;
  a.out = reinterpret_cast<uint16_t*>(half + E.X.out_offset);
  const int64_t groups = (shard + kFinishTokens - 1) / kFinishTokens;
#pragma unroll 1
  for (int64_t g = block; g < groups; g += gridDim.x) {
    const int64_t t0 = g * kFinishTokens, t1 = min(shard, t0 + kFinishTokens);
    const int64_t real = max(int64_t(0), min(t1, E.valid) - t0);
    if (real > 0)
      finish_group<N, Mode::PostPre, V>(a, t0, static_cast<int>(real), mix_s, pre_s, red);
    for (int64_t t = t0 + real; t < t1; ++t) {  // padding rows of the stream outputs are zeros
      for (int k = threadIdx.x; k < N + N * N; k += blockDim.x) {
        if (k < N) {
          a.post[t * N + k] = 0.f;
        } else {
          a.comb[t * N * N + (k - N)] = 0.f;
        }
      }
      for (int64_t k = threadIdx.x; k < N * H; k += blockDim.x) a.stream_out[t * N * H + k] = 0;
    }
    __syncthreads();  // mix_s / pre_s are rewritten by the next group
  }
  const uint64_t epoch = block_epoch(E.s, block) + 1;
  const bool ok =
      block_barrier(E.s, block, epoch, E.header.op, symm::kPhaseSecond, E.header, nullptr);
  set_block_epoch(E.s, block, epoch);
  // Pull: the rows of this block's groups from every rank (rank p's block `block` wrote them),
  // row by row, vectors across the threads.
  const int per_row = static_cast<int>(H / V);
  float nan_values[V];
  fill_nan(nan_values);
  const Pack<V> nan_pack = Pack<V>::from_float(nan_values);
#pragma unroll 1
  for (int64_t g = block; g < groups; g += gridDim.x) {
    const int64_t t0 = g * kFinishTokens, t1 = min(shard, t0 + kFinishTokens);
    for (int k = 0; k < E.s.world; ++k) {
      const int p = (E.s.rank + k) % E.s.world;
      const int64_t end = min(t1, E.header.num_tokens - p * shard);
      const uint16_t* src =
          reinterpret_cast<const uint16_t*>(half_base(E.s, E.s.peers[p], call) + E.X.out_offset);
      for (int64_t t = t0; t < end; ++t) {
        uint16_t* dst = R.gathered + (p * shard + t) * H;
        for (int v = threadIdx.x; v < per_row; v += blockDim.x) {
          if (ok) {
            Pack<V>::load_l2(src + t * H + int64_t(v) * V).store(dst + int64_t(v) * V);
          } else {
            nan_pack.store(dst + int64_t(v) * V);
          }
        }
      }
    }
  }
  end_call(&E.s.state->exchange_done, &E.s.state->exchange_calls);
}

// ---- plain collectives over the barrier exchange -----------------------------------------------
// Rows are cut into spans of kSpanBytes; block b owns spans b, b + grid, ... in every phase, so
// each barrier pairs block b of every rank with exactly the data block b moved.

struct CollectiveRank {
  ExchangeRank e;
  const uint8_t* in;  // (rows, row_bytes)
  uint8_t* out;       // reduce_scatter: (shard, row_bytes); all_reduce: (rows, row_bytes);
                      // all_gather: (kept rows of world * rows, row_bytes)
  int64_t out_bytes;  // the whole of `out`
};

template <int kRanks>
struct CollectiveParams {
  CollectiveRank r[kRanks];
};

// The spans block `blockIdx.x` owns: (row, span) for items block, block + grid, ... < rows * spans.
__device__ __forceinline__ RowWalk block_spans(int64_t row_bytes) {
  return RowWalk(blockIdx.x, static_cast<int>((row_bytes + kSpanBytes - 1) / kSpanBytes),
                 gridDim.x);
}

__device__ __forceinline__ void store_nan16(uint8_t* p) {
  *reinterpret_cast<uint4*>(p) = make_uint4(~0u, ~0u, ~0u, ~0u);
}

// reduce_scatter (kOp = kReduceScatter) and all_reduce (kAllReduce, = reduce-scatter + all-gather)
// of bf16 rows, row_bytes a multiple of 16.
template <boundary::Op kOp, int kRanks>
__global__ void __launch_bounds__(kCopyThreads, kCopyMinBlocks)
    symm_reduce_kernel(const __grid_constant__ CollectiveParams<kRanks> P) {
  const CollectiveRank& R = P.r[blockIdx.y];
  const ExchangeRank& E = R.e;
  if (E.s.absent) return;
  const int block = blockIdx.x;
  const int64_t rb = E.X.row_bytes, shard = E.X.in_rows;
  const uint64_t call = read_call(&E.s.state->exchange_calls);
  if (refused(E.s, E.header.op, call)) return poison_share(R.out, R.out_bytes);
  uint64_t epoch = block_epoch(E.s, block) + 1;
  const CallHeader mine = header_of_call(E, call);
  push_header(E, mine, call);
  for (RowWalk w = block_spans(rb); w.row < shard; w.next()) {
    const int64_t b0 = int64_t(w.col) * kSpanBytes, b1 = min(rb, b0 + kSpanBytes);
    push_shard_rows<8>(E, call, reinterpret_cast<const uint16_t*>(R.in), rb / 2, w.row, w.row + 1,
                       b0 / 2, b1 / 2);
  }
  uint8_t* half = half_base(E.s, own_buffer(E.s), call);
  const bool ok = block_barrier(E.s, block, epoch, E.header.op, symm::kPhaseFirst, mine, half);
  const LandingX xs{&E, half, ok};  // NaN rows when the barrier or the header check failed
  for (RowWalk w = block_spans(rb); w.row < shard; w.next()) {
    const int64_t b = int64_t(w.col) * kSpanBytes + int64_t(threadIdx.x) * 16;
    if (b >= rb) continue;
    float x[8];
    xs.load<8>(PreArgs{}, w.row, b / 2, x);
    const Pack<8> v = Pack<8>::from_float(x);
    if constexpr (kOp == boundary::Op::kReduceScatter) {
      v.store(reinterpret_cast<uint16_t*>(R.out + w.row * rb + b));
    } else {
      v.store(reinterpret_cast<uint16_t*>(half + E.X.out_offset + w.row * rb + b));
    }
  }
  if constexpr (kOp == boundary::Op::kAllReduce) {
    set_block_epoch(E.s, block, epoch);
    epoch += 1;
    const bool ok2 =
        block_barrier(E.s, block, epoch, E.header.op, symm::kPhaseSecond, mine, nullptr);
    for (RowWalk w = block_spans(rb); w.row < shard; w.next()) {
      const int64_t b = int64_t(w.col) * kSpanBytes + int64_t(threadIdx.x) * 16;
      if (b >= rb) continue;
      for (int k = 0; k < E.s.world; ++k) {
        const int p = (E.s.rank + k) % E.s.world;
        if (p * shard + w.row >= E.rows) continue;
        uint8_t* dst = R.out + (p * shard + w.row) * rb + b;
        if (!ok2) {
          store_nan16(dst);
          continue;
        }
        const uint8_t* src = half_base(E.s, E.s.peers[p], call) + E.X.out_offset + w.row * rb + b;
        Pack<8>::load_l2(reinterpret_cast<const uint16_t*>(src))
            .store(reinterpret_cast<uint16_t*>(dst));
      }
    }
  }
  set_block_epoch(E.s, block, epoch);
  end_call(&E.s.state->exchange_done, &E.s.state->exchange_calls);
}

// all_gather of rows of any type (row_bytes a multiple of 16): publish own rows, barrier, pull.
template <int kRanks>
__global__ void __launch_bounds__(kCopyThreads, kCopyMinBlocks)
    symm_gather_kernel(const __grid_constant__ CollectiveParams<kRanks> P) {
  const CollectiveRank& R = P.r[blockIdx.y];
  const ExchangeRank& E = R.e;
  if (E.s.absent) return;
  const int block = blockIdx.x;
  const int64_t rb = E.X.row_bytes, rows = E.X.out_rows;
  const uint64_t call = read_call(&E.s.state->exchange_calls);
  if (refused(E.s, E.header.op, call)) return poison_share(R.out, R.out_bytes);
  const uint64_t epoch = block_epoch(E.s, block) + 1;
  uint8_t* half = half_base(E.s, own_buffer(E.s), call);
  uint8_t* published = half + E.X.out_offset;
  const CallHeader mine = header_of_call(E, call);
  push_header(E, mine, call);
  for (RowWalk w = block_spans(rb); w.row < rows; w.next()) {
    const int64_t b = int64_t(w.col) * kSpanBytes + int64_t(threadIdx.x) * 16;
    if (b < rb) {
      *reinterpret_cast<uint4*>(published + w.row * rb + b) =
          __ldg(reinterpret_cast<const uint4*>(R.in + w.row * rb + b));
    }
  }
  const bool ok = block_barrier(E.s, block, epoch, E.header.op, symm::kPhaseFirst, mine, half);
  set_block_epoch(E.s, block, epoch);
  // Keep only rows below the header's num_tokens (-1: all) of the concatenation.
  const int64_t keep = E.header.num_tokens < 0 ? rows * E.s.world : E.header.num_tokens;
  for (RowWalk w = block_spans(rb); w.row < rows; w.next()) {
    const int64_t b = int64_t(w.col) * kSpanBytes + int64_t(threadIdx.x) * 16;
    if (b >= rb) continue;
    for (int k = 0; k < E.s.world; ++k) {
      const int p = (E.s.rank + k) % E.s.world;
      if (p * rows + w.row >= keep) continue;
      uint8_t* dst = R.out + (p * rows + w.row) * rb + b;
      if (!ok) {
        store_nan16(dst);
        continue;
      }
      const uint8_t* src = half_base(E.s, E.s.peers[p], call) + E.X.out_offset + w.row * rb + b;
      *reinterpret_cast<uint4*>(dst) = __ldcg(reinterpret_cast<const uint4*>(src));
    }
  }
  end_call(&E.s.state->exchange_done, &E.s.state->exchange_calls);
}

}  // namespace mhc_sp::cuda
