// SPDX-License-Identifier: Apache-2.0
#pragma once
// The boundary protocol: how the ranks of one group exchange a boundary's rows through memory
// that every rank can load and store directly. The CPU shared-memory transport
// (csrc/transport/shm/, one POSIX segment per group) follows it; a device transport over
// symmetric memory follows the same rules, with "segment" meaning the set of peer buffers.
// Plain structs and offsets only, so host code and CUDA kernels compute the same layout.
//
// Layout (byte offsets from the segment's start, every region kAlign-aligned):
//
//   SegmentHeader                          at 0, one page
//   RankControl[world]                     at control_offset(), one kAlign block per rank
//   slot(rank, half) for rank < world,     at half_offset(world, half_bytes, rank, half),
//     half in {0, 1}, half_bytes each        each laid out as CallHeader | in rows | out rows
//
// Rules (every rank, every call):
//  1. Ownership. Rank r writes only its own RankControl and its own slot halves; it reads peers'
//     slots only between the barriers that publish them (rules 3, 4). The SegmentHeader is
//     written by its creator before any peer maps it, except `broken` and `blamed` (any rank,
//     rule 6) and `next_name` (rank 0, rule 7).
//  2. Calls. Every rank makes the same sequence of calls on a workspace. Call number c (0, 1, ...)
//     uses half c % 2 of every slot. A call writes its CallHeader, then its `in` rows, arrives at
//     a barrier, and may publish `out` rows before a second barrier. Two halves let a call with a
//     single barrier end without a trailing one: a fast rank's next call writes the other half,
//     and the call after that cannot pass its first barrier before every peer has arrived there,
//     i.e. has finished reading this half.
//  3. Barriers use monotonic epochs. A rank arriving at its e-th barrier of the segment stores e
//     into its RankControl::arrived with release semantics (after all its stores to its slot),
//     then waits until every peer's `arrived`, loaded with acquire semantics, is >= e (host
//     waiters that stop spinning sleep on the peer's arrived_low, see RankControl). Epochs
//     start at 0 in a fresh segment and only grow (64 bits never wrap), so nothing is re-armed
//     and no stale value can pass for a new one. A peer can be at most one epoch ahead.
//  4. Headers are checked at each call's first barrier: every rank compares every peer's
//     CallHeader (op, flags, rows, num_tokens, dtype, inner size, call number, epoch and, on the
//     device, the launch plan) with its own. All ranks see the same headers, so all of them detect
//     a mismatch (different ops, token counts, shapes, or a rank that skipped a call) and fail;
//     nobody reads rows laid out for a different call. Sizes come from the header (layout_for),
//     never from the peer's data. On the device, where each block has its own barrier, every block
//     writes the header (its epoch field 0, as blocks keep their own epochs; the call number tells
//     calls apart) and checks every peer's before it reads any of that peer's rows
//     (transport/symm/device/sync.cuh).
//  5. Reductions sum in fp32 (fp64 for fp64 data) in rank order 0..world-1, starting from +0,
//     and round once to the output type: every rank gets bitwise the same sum. Starting from +0
//     makes a position where every rank holds -0 sum to +0 (as it must where -0 is the symm
//     mailbox's empty marker); every transport and mhc_sp.reference.sum_partials do the same.
//     Rows at or past a call's real rows (padding) read as zeros and are never published.
//  6. Errors. A wait is bounded by the group's timeout and fails early when a peer is known to be
//     gone (CPU: its process no longer exists). The failing rank stores 1 + its rank into
//     SegmentHeader::broken (and, on the CPU, the rank it blames and why into `blamed`, so that
//     every rank's error names the same culprit); every waiter checks that word and fails at
//     once, and every later call on a broken workspace fails before touching it. A rank checks
//     the word before it arrives at a barrier, after it passes one (the first barrier of a call:
//     after the header check, so that a mismatch is reported as such on every rank) and, on the
//     CPU, between chunks of the rows it publishes: a rank that was stopped while its peers gave
//     up writes nothing more into the abandoned workspace once it runs again (at most the rest of
//     the chunk it was copying). On the device, where a kernel finds the word set, it records the
//     refusal, naming the rank that broke it, and fills its outputs with NaN; the rank's next op
//     raises.
//  7. Capacity. A call needs layout_for(header, world).need bytes of its half. When the half is
//     too small on the CPU transport, every rank (they make the same call, rule 2) takes part in
//     growing: the call's header alone is published at a barrier (so rule 4 runs first), rank 0
//     writes the name of a larger segment into next_name and creates it, a barrier, the peers
//     map it, a barrier, rank 0 unlinks it; everyone then rewrites its header in the new segment
//     and continues there from epoch 0. There is no silent size cap: a segment that cannot be
//     reserved is an error. Every name a workspace uses is its first name plus a suffix, and a
//     rank that fails unlinks the names it knows (a missing name is no error), so a segment
//     survives no crash of any rank, rank 0 included.

#include <cstdint>

#include "mhc_sp/detail/shard.h"  // shard_rows, shard_valid_rows; MHC_SP_HOST_DEVICE

namespace mhc_sp::boundary {

constexpr uint64_t kMagic = 0x315042505343484dull;  // "MHCSPBP1" in memory order
constexpr uint32_t kVersion = 1;
constexpr int64_t kAlign = 128;  // two CPU cache lines; one GPU L2 sector group
constexpr int64_t kPage = 4096;
constexpr int64_t kMaxWorld = 256;
constexpr int64_t kNameBytes = 64;

enum class Op : uint32_t {
  kNone = 0,
  kAllGather = 1,
  kReduceScatter = 2,
  kAllReduce = 3,
  kFusedEntry = 4,
  kFusedLayer = 5,
  kFusedHead = 6,
};

// Why a rank gave up on a workspace (SegmentHeader::blamed, CPU transport).
enum class Fault : uint32_t {
  kNone = 0,
  kExited = 1,    // the blamed rank's process is gone, or it left the workspace
  kTimedOut = 2,  // the blamed rank did not reach a barrier within the timeout
  kMismatch = 3,  // the blamed rank's call header differs from rank 0's
  kError = 4,     // the blamed rank abandoned a call after an error of its own
};

enum Flags : uint32_t {
  kSharded = 1u << 0,  // fused ops: token-sharded stream (reduce-scatter + all-gather)
};

struct SegmentHeader {
  uint64_t magic;        // kMagic, stored last by the creator (release)
  uint32_t version;      // kVersion
  uint32_t world;        // ranks
  uint64_t half_bytes;   // bytes of one slot half (a multiple of kAlign)
  uint64_t total_bytes;  // segment_bytes(world, half_bytes): the size every rank must see
  uint32_t broken;       // 0, or 1 + the rank that marked the workspace broken
  uint32_t blamed;       // CPU: 0, or (Fault << 16) | (1 + the rank at fault), first writer wins
  char next_name[kNameBytes];  // growth: the name of the segment that replaces this one
};

struct alignas(kAlign) RankControl {
  uint64_t arrived;      // the last barrier epoch this rank reached (rule 3)
  int64_t pid;           // CPU liveness: the rank's process id once it has mapped the segment,
                         // negated when it leaves the workspace (its group freed or re-made)
  uint32_t arrived_low;  // CPU: the low 32 bits of `arrived`, stored after it: a futex word
  uint32_t sleepers;     // CPU: waiters asleep on arrived_low, woken by this rank's next arrival
};

struct alignas(kAlign) CallHeader {
  uint32_t op;          // Op
  uint32_t flags;       // Flags
  int64_t rows;         // rows this rank publishes in `in` (a partial's num_tokens rows, x's rows)
  int64_t num_tokens;   // fused ops: real tokens of the boundary; collectives: rows kept or -1
  int64_t inner;        // elements per row
  uint32_t dtype;       // element type code (c10::ScalarType on the CPU transport)
  uint32_t elem_bytes;  // bytes per element
  uint64_t call;        // call number c on this workspace (rule 2)
  uint64_t epoch;       // epoch of the barrier at which the header is checked (rule 4)
  // The device's launch plan (symm transport; 0 on the CPU), which every rank must share: block b
  // of a rank pairs with block b of every other at each barrier and reads what they moved.
  uint32_t blocks;            // grid of the call's (first) kernel
  uint32_t finish_blocks;     // grid of its second kernel (the sharded boundary's finish), or 0
  uint32_t chunks_per_split;  // the pre's H-chunks per block (cuda/math_launch.cuh plan_pre)
  uint32_t unused;
};

MHC_SP_HOST_DEVICE constexpr int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// The token shards (mhc_sp/detail/shard.h).
using mhc_sp::shard_rows;
using mhc_sp::shard_valid_rows;

MHC_SP_HOST_DEVICE constexpr int64_t control_offset() { return kPage; }

MHC_SP_HOST_DEVICE constexpr int64_t slots_offset(int64_t world) {
  return align_up(control_offset() + world * static_cast<int64_t>(sizeof(RankControl)), kPage);
}

MHC_SP_HOST_DEVICE constexpr int64_t segment_bytes(int64_t world, int64_t half_bytes) {
  return slots_offset(world) + world * 2 * half_bytes;
}

MHC_SP_HOST_DEVICE constexpr int64_t half_offset(int64_t world, int64_t half_bytes, int64_t rank,
                                                 int64_t half) {
  return slots_offset(world) + (rank * 2 + half) * half_bytes;
}

// Where a call's rows sit inside a slot half, relative to the half's start.
struct CallLayout {
  int64_t in_offset, in_bytes;    // rows published before the first barrier
  int64_t out_offset, out_bytes;  // rows published before the second barrier (sharded ops)
  int64_t need;                   // bytes of the half the call uses
};

MHC_SP_HOST_DEVICE constexpr CallLayout call_layout(int64_t in_bytes, int64_t out_bytes) {
  const int64_t in_offset = align_up(static_cast<int64_t>(sizeof(CallHeader)), kAlign);
  const int64_t out_offset = in_offset + align_up(in_bytes, kAlign);
  return {in_offset, in_bytes, out_offset, out_bytes, out_offset + align_up(out_bytes, kAlign)};
}

// The layout a call's header implies for a group of `world` ranks:
//  all_gather, reduce_scatter, all_reduce: in = the rank's `rows` rows.
//  fused_layer / fused_head: in = the partial's first num_tokens rows; sharded: out = the rank's
//    shard of the gathered output (layer_input / hidden), shard_rows(num_tokens, world) rows.
//  fused_entry (sharded only; replicated needs no exchange): out = the shard of layer_input.
MHC_SP_HOST_DEVICE constexpr CallLayout layout_for(const CallHeader& h, int64_t world) {
  const int64_t row_bytes = h.inner * static_cast<int64_t>(h.elem_bytes);
  const bool sharded = (h.flags & kSharded) != 0;
  const int64_t out_rows = sharded ? shard_rows(h.num_tokens, world) : 0;
  switch (static_cast<Op>(h.op)) {
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllReduce: return call_layout(h.rows * row_bytes, 0);
    case Op::kFusedLayer:
    case Op::kFusedHead: return call_layout(h.rows * row_bytes, out_rows * row_bytes);
    case Op::kFusedEntry: return call_layout(0, out_rows * row_bytes);
    default: return call_layout(0, 0);
  }
}

MHC_SP_HOST_DEVICE inline bool same_call(const CallHeader& a, const CallHeader& b) {
  return a.op == b.op && a.flags == b.flags && a.rows == b.rows && a.num_tokens == b.num_tokens &&
         a.inner == b.inner && a.dtype == b.dtype && a.elem_bytes == b.elem_bytes &&
         a.call == b.call && a.epoch == b.epoch && a.blocks == b.blocks &&
         a.finish_blocks == b.finish_blocks && a.chunks_per_split == b.chunks_per_split;
}

// Rule 3's two memory operations on the host (the CPU transport; the device's, at system scope, are
// in transport/symm/device/ptx.cuh), and the relaxed load of a word several ranks may store.
inline void store_release(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

inline uint64_t load_acquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

inline uint32_t load_broken(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

// SegmentHeader::blamed (rule 6): why (a Fault) and 1 + the rank at fault, in one word.
MHC_SP_HOST_DEVICE constexpr uint32_t blame_word(int64_t culprit, Fault why) {
  return (static_cast<uint32_t>(why) << 16) | static_cast<uint32_t>(culprit + 1);
}
MHC_SP_HOST_DEVICE constexpr Fault blamed_fault(uint32_t word) {
  return static_cast<Fault>(word >> 16);
}
MHC_SP_HOST_DEVICE constexpr int64_t blamed_rank(uint32_t word) {
  return static_cast<int64_t>(word & 0xffffu) - 1;
}

// The first blame is the one recorded (like `broken`); stored before `broken`, so that a rank that
// sees the workspace broken (and then fences) also sees why. (The device's: transport/symm/device/
// sync.cuh.)
inline void blame(uint32_t* p, uint32_t word) {
  uint32_t expected = 0;
  __atomic_compare_exchange_n(p, &expected, word, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

// The first rank to break the workspace is the one recorded.
inline void mark_broken(uint32_t* p, uint32_t rank) {
  uint32_t expected = 0;
  __atomic_compare_exchange_n(p, &expected, rank + 1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

}  // namespace mhc_sp::boundary
