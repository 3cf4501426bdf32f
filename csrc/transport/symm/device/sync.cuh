// SPDX-License-Identifier: Apache-2.0
#pragma once
// Waits, error records and the per-block barrier of the symm kernels (rules 3, 4 and 6 of
// mhc_sp/detail/boundary_protocol.h; layout in transport/symm/layout.h).
//
// Progress. Blocks wait for blocks of other ranks (mailbox polls, barriers), so every launch is
// capped to blocks that are resident together (the launcher asks the occupancy calculator; the
// single-GPU testing module launches cooperatively, which fails rather than oversubscribe). Blocks
// push everything they owe before they wait for anything, so the waits form no cycle.
//
// Memory ordering of a barrier (the single-GPU harness shares one L2 and cannot catch scope bugs,
// so each choice is argued here): barrier data (landing rows, headers, published `out` rows) is
// written with ordinary stores by every thread of a block; __syncthreads() then orders those
// stores before thread p's st.release.sys of the epoch into rank p's flag word (bar.sync makes the
// block's stores precede the release in causality order, and a release is cumulative). The waiting
// thread's ld.acquire.sys that reads the epoch synchronizes with it, and the __syncthreads_or()
// after the wait (a bar.sync with a reduction) extends that to every thread of the waiting block,
// whose loads of the data follow. System scope because the writer and the reader are different
// GPUs (or, for the flags of the harness, different blocks of one). Data loads after the barrier
// use ld.global.cg (L2), never the non-coherent read-only path. Call counters and epochs are
// device-local (ordinary memory, this GPU only): read at kernel start, advanced by the last block
// to finish (atomic counter + __threadfence, gpu scope); the next kernel in the stream sees them.
//
// Failures (rule 6). A wait that fails records the error, marks every rank's buffer broken and
// poisons what the failing block would have produced (NaN); every other waiter sees the broken
// word within 64 polls and does the same. A kernel that starts on a broken workspace records
// kPeerBroken (naming the rank that broke it), reads and pushes nothing, and fills its outputs with
// NaN (each block the outputs it would have written, so that no row has two writers). So every
// output element of a failed call is either what a good call would have produced or NaN, never a
// stale or uninitialised value, eager or replayed; the next eager op on the group raises
// (SymmWorkspace::check).

#include <cuda_runtime.h>

#include "mhc_sp/detail/boundary_protocol.h"
#include "transport/symm/device/ptx.cuh"
#include "transport/symm/layout.h"

namespace mhc_sp::cuda {

using symm::BufferLayout;
using symm::CallHeader;
using symm::ErrorRecord;
using symm::ExchangeLayout;
using symm::LamportTag;
using symm::LocalState;
using symm::RankView;

template <int V>
__device__ __forceinline__ void fill_nan(float (&v)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) v[e] = __int_as_float(0x7fc00000);
}

__device__ __forceinline__ uint8_t* own_buffer(const RankView& s) { return s.peers[s.rank]; }

__device__ __forceinline__ uint32_t* broken_word(uint8_t* buffer) {
  return &reinterpret_cast<boundary::SegmentHeader*>(buffer)->broken;
}

// Fills this rank's error record once (the first failing thread wins).
__device__ __forceinline__ void record_error(const RankView& s, uint32_t code, int peer, int block,
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

__device__ __forceinline__ uint32_t* blamed_word(uint8_t* buffer) {
  return &reinterpret_cast<boundary::SegmentHeader*>(buffer)->blamed;
}

// Rule 6's words, written by the device (the host's side: boundary::blame, boundary::mark_broken).
// The first blame is the one recorded; it is stored before `broken`, so that a rank that sees the
// workspace broken (and then fences) also sees why.
__device__ __forceinline__ void blame(uint32_t* p, uint32_t word) { atomicCAS_system(p, 0u, word); }

// The first rank to break the workspace is the one recorded. `p` may be a peer GPU's memory, so
// the CAS is system-scoped; the fence before it orders what this rank stored first (its header
// or tag, the blame) before the word that makes every waiter look.
__device__ __forceinline__ void mark_broken(uint32_t* p, uint32_t rank) {
  __threadfence_system();
  atomicCAS_system(p, 0u, rank + 1);
  __threadfence_system();
}

// Marks every rank's buffer broken (this rank recorded first), so that every waiter of every rank
// gives up at once instead of waiting out its own timeout. A mismatch blames its culprit first
// (rule 6), so that every rank reports the same mismatch, also one that finds the workspace broken
// before it has seen the culprit's header or tag itself.
__device__ __forceinline__ void break_workspace(const RankView& s, int mismatch_culprit = -1) {
  if (mismatch_culprit >= 0) {
    const uint32_t word = boundary::blame_word(mismatch_culprit, boundary::Fault::kMismatch);
    for (int p = 0; p < s.world; ++p) blame(blamed_word(s.peers[p]), word);
  }
  for (int p = 0; p < s.world; ++p) mark_broken(broken_word(s.peers[p]), s.rank);
}

// What a rank records when it finds the workspace broken (`broken` = 1 + the rank that broke it):
// the mismatch that rank found, naming the same culprit, or that the rank broke it.
__device__ __forceinline__ void record_broken(const RankView& s, uint32_t broken, int block,
                                              uint32_t op, uint32_t phase, uint64_t epoch,
                                              uint64_t waited_ns) {
  fence_acq_rel_sys();  // the blame was stored before the broken word
  const uint32_t blamed = load_relaxed_sys(blamed_word(own_buffer(s)));
  if (boundary::blamed_fault(blamed) == boundary::Fault::kMismatch) {
    record_error(s, symm::kMismatch, static_cast<int>(boundary::blamed_rank(blamed)), block, op,
                 phase, epoch, waited_ns);
  } else {
    record_error(s, symm::kPeerBroken, static_cast<int>(broken) - 1, block, op, phase, epoch,
                 waited_ns);
  }
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
__device__ __forceinline__ bool wait_until(const RankView& s, const WaitSite& w, Ready&& ready) {
  if (ready()) return true;
  const uint64_t t0 = globaltimer_ns();
  for (uint32_t spin = 1;; ++spin) {
    if (ready()) return true;
    if ((spin & 63u) == 0u) {
      const uint32_t broken = load_relaxed_sys(broken_word(own_buffer(s)));
      if (broken != 0) {
        record_broken(s, broken, w.block, w.op, w.phase, w.epoch, globaltimer_ns() - t0);
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
// the whole block (one load, shared). Block 0 records why (record_broken): kPeerBroken naming the
// rank that broke it, or the mismatch that broke it, when this is the call that mismatched.
__device__ __forceinline__ bool refused(const RankView& s, uint32_t op, uint64_t call) {
  __shared__ uint32_t broken;
  if (threadIdx.x == 0) broken = load_relaxed_sys(broken_word(own_buffer(s)));
  __syncthreads();
  const uint32_t b = broken;
  __syncthreads();  // `broken` may be reused by the next call of this function
  if (b != 0 && blockIdx.x == 0 && threadIdx.x == 0) {
    record_broken(s, b, 0, op, symm::kPhaseStart, call, 0);
  }
  return b != 0;
}

// Whether rank p's header of the call, in this rank's half, equals `mine` (rule 4's fields; the
// epoch is 0 on both sides, see header_of_call). Read as five 16-byte words and compared field by
// field, so nothing is copied to local memory.
__device__ __forceinline__ uint64_t u64_of(uint32_t lo, uint32_t hi) {
  return (uint64_t(hi) << 32) | lo;
}

__device__ __forceinline__ bool header_matches(const CallHeader& mine, const uint8_t* half, int p) {
  static_assert(offsetof(CallHeader, op) == 0 && offsetof(CallHeader, flags) == 4 &&
                    offsetof(CallHeader, rows) == 8 && offsetof(CallHeader, num_tokens) == 16 &&
                    offsetof(CallHeader, inner) == 24 && offsetof(CallHeader, dtype) == 32 &&
                    offsetof(CallHeader, elem_bytes) == 36 && offsetof(CallHeader, call) == 40 &&
                    offsetof(CallHeader, epoch) == 48 && offsetof(CallHeader, blocks) == 56 &&
                    offsetof(CallHeader, finish_blocks) == 60 &&
                    offsetof(CallHeader, chunks_per_split) == 64,
                "the header's fields sit in its first five 16-byte words");
  const auto* src = reinterpret_cast<const uint4*>(half + symm::header_offset(p));
  const uint4 w0 = load_relaxed_v4(src), w1 = load_relaxed_v4(src + 1),
              w2 = load_relaxed_v4(src + 2), w3 = load_relaxed_v4(src + 3),
              w4 = load_relaxed_v4(src +
                                   4);  // other blocks of p may still be writing the same bytes
  return w0.x == mine.op && w0.y == mine.flags && u64_of(w0.z, w0.w) == uint64_t(mine.rows) &&
         u64_of(w1.x, w1.y) == uint64_t(mine.num_tokens) &&
         u64_of(w1.z, w1.w) == uint64_t(mine.inner) && w2.x == mine.dtype &&
         w2.y == mine.elem_bytes && u64_of(w2.z, w2.w) == mine.call &&
         u64_of(w3.x, w3.y) == mine.epoch && w3.z == mine.blocks && w3.w == mine.finish_blocks &&
         w4.x == mine.chunks_per_split;
}

// The block barrier of rule 3, per block index: block `block` of every rank stores `epoch` into
// its word of every peer's flags (release, system scope), then waits for every peer's word in its
// own buffer to reach it (acquire). Thread p < world talks to rank p. With `check_half` set, the
// same thread then compares rank p's header of the call (which p's block wrote before its release,
// at header_offset(p) of this rank's half) with `mine` (rule 4): every block checks every peer
// before it reads a row that peer pushed. true when every peer arrived with the same call;
// otherwise the error is recorded and the workspace broken.
__device__ __forceinline__ bool block_barrier(const RankView& s, int block, uint64_t epoch,
                                              uint32_t op, uint32_t phase, const CallHeader& mine,
                                              const uint8_t* check_half) {
  __syncthreads();  // the block's stores precede the releases below
  bool failed = false;
  const int p = threadIdx.x;
  if (p < s.world) {
    auto* theirs = reinterpret_cast<uint64_t*>(s.peers[p] + symm::flag_offset(s.L, block, s.rank));
    store_release_sys(theirs, epoch);
    const auto* flag =
        reinterpret_cast<const uint64_t*>(own_buffer(s) + symm::flag_offset(s.L, block, p));
    const WaitSite site{p, block, op, phase, epoch};
    if (!wait_until(s, site, [&] { return load_acquire_sys(flag) >= epoch; })) {
      failed = true;
    } else if (check_half != nullptr && !header_matches(mine, check_half, p)) {
      record_error(s, symm::kMismatch, p, block, op, phase, epoch, 0);
      break_workspace(s, p);
      failed = true;
    }
  }
  // A barrier with a reduction: extends each acquire to the whole block, and every thread learns
  // the outcome from its own register (no shared flag a lagging warp could read too late).
  return __syncthreads_or(failed) == 0;
}

// The calling block's next barrier epoch (epochs only grow; read by all, written back by thread 0
// in end_epochs once the block is done with this kernel's barriers).
__device__ __forceinline__ uint64_t block_epoch(const RankView& s, int block) {
  return *reinterpret_cast<volatile uint64_t*>(&s.state->epochs[block]);
}

__device__ __forceinline__ void set_block_epoch(const RankView& s, int block, uint64_t epoch) {
  if (threadIdx.x == 0) s.state->epochs[block] = epoch;
}

// A call counter's value for this kernel, the same for every block (advanced only by the last
// block of the call's final kernel, after every block has read it).
__device__ __forceinline__ uint64_t read_call(const uint64_t* counter) {
  return *reinterpret_cast<const volatile uint64_t*>(counter);
}

// The call's end: the last block to get here runs last() (thread 0) and advances the counter.
// Each block's fence before its increment and the last block's fence after it order every block's
// reads of this call (the counter, the tags last() re-arms) before last()'s writes.
template <class Last>
__device__ __forceinline__ void end_call(uint32_t* done, uint64_t* calls, Last&& last) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(done, 1u) == gridDim.x - 1) {
      __threadfence();
      last();
      atomicExch(done, 0u);  // atomic: the other blocks' increments are ordered only through it
      *calls += 1;
      __threadfence();
    }
  }
}

__device__ __forceinline__ void end_call(uint32_t* done, uint64_t* calls) {
  end_call(done, calls, [] {});
}

__device__ __forceinline__ uint8_t* half_base(const RankView& s, uint8_t* buffer, uint64_t call) {
  return buffer + symm::half_offset(s.L, symm::half_index(call));
}

}  // namespace mhc_sp::cuda
