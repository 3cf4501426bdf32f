// SPDX-License-Identifier: Apache-2.0
#pragma once
// The symmetric-memory boundary (CUDA `symm` transport): where things sit in each rank's peer
// buffer, which call uses which mailbox or half, and the records a failed wait leaves behind.
// Plain structs and constexpr arithmetic, so host code (transport/symm/host.cpp, tested on CPU) and
// the kernels (transport/symm/device/) compute the same layout.
//
// It follows the boundary protocol (mhc_sp/detail/boundary_protocol.h) with "segment" meaning the
// set of the group's peer buffers, one per rank, all the same size (torch symmetric memory). Device
// code prefers remote stores to remote loads (a store over NVLink is fire-and-forget, a load waits
// a round trip), so what the CPU transport keeps in the writer's slot sits here in the reader's
// buffer, written by the owner of the slot:
//  - RankControl::arrived of rank p becomes flags[block][p] in every peer's buffer: block `block`
//    of rank p stores its barrier epoch there (release, system scope) and waits on its own copy
//    of every peer's word (acquire). Epochs are per block index and only grow (rule 3).
//  - Rank p's slot half for call c becomes, in every owner q's buffer, q's half c % 2: p's
//    CallHeader at headers[p] and p's rows destined to q at landing[p] (push reduce-scatter);
//    rows q publishes for everyone (its shard of a gathered output) sit in q's own `out` area and
//    peers pull them after the second barrier.
//  - The Lamport mailbox (decode-sized all-reduces, no barrier) has no CPU counterpart: call k
//    pushes into every peer's mailbox k % 3, slot [rank]; an idle mailbox holds -0.0 everywhere
//    (bf16 0x8000), pushed data never does (-0 is sent as +0), so a reader waits per 16-byte
//    vector until none of its values is -0, and re-arms the vector (stores -0) once consumed. The
//    last 16 bytes of a slot are the call's tag (LamportTag: kind, rows, inner size, call number,
//    every lane below 0x8000): the Lamport form of rule 4's header. Every block of the reader
//    checks every source's tag before it reads any of that source's rows.
//  - SegmentHeader (page 0 of every buffer) carries magic, world, sizes and the `broken` word.
//    A rank whose wait fails marks its own and every peer's header broken; every wait checks its
//    own header and gives up at once when it is set; a kernel that starts on a broken workspace
//    records kPeerBroken (naming the rank that broke it) and fills its outputs with NaN (all-ones
//    bytes) instead of computing them, so a call that did not run is never mistaken for one that
//    did, also under CUDA-graph replay, where no host check runs between calls.

#include <cstdint>

#include "mhc_sp/detail/boundary_protocol.h"

namespace mhc_sp::symm {

using boundary::align_up;
using boundary::CallHeader;
using boundary::kAlign;
using boundary::kPage;
using boundary::Op;
using boundary::shard_rows;
using boundary::shard_valid_rows;

constexpr int64_t kMaxRanks = 16;          // ranks of one symm group (one NVLink domain)
constexpr int64_t kMaxBlocks = 1024;       // barrier slots per rank: grids never exceed it
constexpr int64_t kMailboxes = 3;          // Lamport mailboxes (triple buffering)
constexpr int64_t kLamportMaxTokens = 16;  // decode boundaries up to here use the mailbox
constexpr uint16_t kNegZeroBits = 0x8000;  // bf16 -0.0: "not arrived yet"

constexpr int64_t kLamportTagBytes = 16;  // the call's tag at the end of every mailbox slot

static_assert(kMaxRanks <= boundary::kMaxWorld, "a symm group is a boundary-protocol group");

// Default sizes: a mailbox slot holds 16 tokens of H = 8192 bf16 and the tag; a half holds a
// sharded boundary of 8192 tokens at H = 7168 for any world >= 2 (a call that needs more uses
// NCCL).
constexpr int64_t kDefaultMailboxSlotBytes = kLamportMaxTokens * 8192 * 2 + kAlign;
constexpr int64_t kDefaultHalfBytes = int64_t(192) << 20;

// Byte offsets inside one rank's buffer; every region starts on a page.
struct BufferLayout {
  int64_t world;
  int64_t flags_offset;        // uint64_t flags[kMaxBlocks][world]
  int64_t mailbox_offset;      // bf16 mailbox[kMailboxes][world][mailbox_slot_bytes / 2]
  int64_t mailbox_slot_bytes;  // one source's rows in one mailbox
  int64_t halves_offset;       // half[2][half_bytes]
  int64_t half_bytes;
  int64_t total_bytes;  // what every rank must allocate
};

MHC_SP_HOST_DEVICE constexpr BufferLayout buffer_layout(int64_t world, int64_t mailbox_slot_bytes,
                                                        int64_t half_bytes) {
  BufferLayout L{};
  L.world = world;
  L.flags_offset = kPage;  // page 0: boundary::SegmentHeader
  L.mailbox_offset = align_up(L.flags_offset + kMaxBlocks * world * 8, kPage);
  L.mailbox_slot_bytes = align_up(mailbox_slot_bytes, kAlign);
  L.halves_offset = align_up(L.mailbox_offset + kMailboxes * world * L.mailbox_slot_bytes, kPage);
  L.half_bytes = align_up(half_bytes, kPage);
  L.total_bytes = L.halves_offset + 2 * L.half_bytes;
  return L;
}

MHC_SP_HOST_DEVICE constexpr int64_t flag_offset(const BufferLayout& L, int64_t block,
                                                 int64_t src) {
  return L.flags_offset + (block * L.world + src) * 8;
}

MHC_SP_HOST_DEVICE constexpr int64_t mailbox_index(uint64_t lamport_call) {
  return static_cast<int64_t>(lamport_call % kMailboxes);
}

MHC_SP_HOST_DEVICE constexpr int64_t mailbox_slot_offset(const BufferLayout& L, int64_t mailbox,
                                                         int64_t src) {
  return L.mailbox_offset + (mailbox * L.world + src) * L.mailbox_slot_bytes;
}

// Where source `src`'s tag sits in `mailbox` (its rows take the slot's bytes before it).
MHC_SP_HOST_DEVICE constexpr int64_t lamport_tag_offset(const BufferLayout& L, int64_t mailbox,
                                                        int64_t src) {
  return mailbox_slot_offset(L, mailbox, src) + L.mailbox_slot_bytes - kLamportTagBytes;
}

// Bytes of rows a mailbox slot holds (the tag takes the rest).
MHC_SP_HOST_DEVICE constexpr int64_t lamport_row_bytes(const BufferLayout& L) {
  return L.mailbox_slot_bytes - kLamportTagBytes;
}

// What a Lamport call is, as 8 bf16 lanes of 15 bits each (never 0x8000, the empty marker):
// kind (Op), rows and inner size (2 lanes each), the call number modulo 2^30 (2 lanes: ranks are
// never that many calls apart) and the launch plan (blocks in the grid and chunks per split of the
// pre, which every rank must share: block b reads the rows block b of every peer pushed). Equal
// tags: the same call, launched the same way.
struct LamportTag {
  uint16_t lane[8];
};

MHC_SP_HOST_DEVICE constexpr LamportTag lamport_tag(Op kind, int64_t rows, int64_t inner,
                                                    uint64_t call, int64_t blocks,
                                                    int64_t chunks_per_split) {
  LamportTag t{};
  const uint64_t r = static_cast<uint64_t>(rows), i = static_cast<uint64_t>(inner);
  uint32_t log_chunks = 0;  // chunks per split: a power of two, at most 32 (plan_pre)
  while ((int64_t{1} << log_chunks) < chunks_per_split && log_chunks < 7) ++log_chunks;
  t.lane[0] = static_cast<uint16_t>(static_cast<uint32_t>(kind) & 0x7fffu);
  t.lane[1] = static_cast<uint16_t>(r & 0x7fffu);
  t.lane[2] = static_cast<uint16_t>((r >> 15) & 0x7fffu);
  t.lane[3] = static_cast<uint16_t>(i & 0x7fffu);
  t.lane[4] = static_cast<uint16_t>((i >> 15) & 0x7fffu);
  t.lane[5] = static_cast<uint16_t>(call & 0x7fffu);
  t.lane[6] = static_cast<uint16_t>((call >> 15) & 0x7fffu);
  t.lane[7] = static_cast<uint16_t>((static_cast<uint64_t>(blocks) & 0x7ffu) | (log_chunks << 11));
  return t;
}

static_assert(kMaxBlocks <= 0x7ff + 1, "a grid's block count fits the tag's 11 bits");

MHC_SP_HOST_DEVICE constexpr int64_t half_index(uint64_t exchange_call) {
  return static_cast<int64_t>(exchange_call % 2);
}

MHC_SP_HOST_DEVICE constexpr int64_t half_offset(const BufferLayout& L, int64_t half) {
  return L.halves_offset + half * L.half_bytes;
}

// Where a barrier-exchanged call's data sits inside a half (offsets from the half's start).
// The slots are fixed by the workspace (half_bytes and world), never by the call: source p pushes
// only into landing slot p of a peer's half, and an owner publishes only into its own `out` slot,
// so ranks that disagree about a call (a num_tokens or op mismatch, reported at the first barrier)
// still never write the same bytes before the header check sees it.
struct ExchangeLayout {
  int64_t in_rows;   // rows each source pushes to each owner (the owner's shard)
  int64_t out_rows;  // rows the owner publishes in `out`
  int64_t row_bytes;
  int64_t landing_offset;  // source p's rows at landing_offset + p * landing_stride
  int64_t landing_stride;  // bytes of a slot: every landing slot and the out slot
  int64_t out_offset;
  int64_t need;  // the smallest half whose slots hold this call's rows
};

MHC_SP_HOST_DEVICE constexpr int64_t header_offset(int64_t src) { return src * kAlign; }

// The 16-byte words of a CallHeader that hold its fields (the rest of its kAlign bytes is padding).
constexpr int kHeaderWords = 5;
static_assert(sizeof(CallHeader) >= kHeaderWords * 16 && sizeof(CallHeader) <= kAlign,
              "a call header is kHeaderWords 16-byte words in its slot");

// The exchange a call's header implies in a half of half_bytes (h.rows: the caller's rows of x or
// partial):
//  reduce_scatter: each owner's shard of ceil(rows / world) rows lands from every source;
//  all_reduce: the same, and each owner publishes its reduced shard for the gather;
//  all_gather: each rank publishes its `rows` rows;
//  fused_layer / fused_head (sharded): the shard of num_tokens lands, the owner publishes its
//    shard of the gathered output; fused_entry (sharded): publish only.
MHC_SP_HOST_DEVICE constexpr ExchangeLayout exchange_layout(const CallHeader& h, int64_t world,
                                                            int64_t half_bytes) {
  ExchangeLayout X{};
  X.row_bytes = h.inner * static_cast<int64_t>(h.elem_bytes);
  const bool sharded = (h.flags & boundary::kSharded) != 0;
  switch (static_cast<Op>(h.op)) {
    case Op::kReduceScatter: X.in_rows = shard_rows(h.rows, world); break;
    case Op::kAllReduce: X.in_rows = X.out_rows = shard_rows(h.rows, world); break;
    case Op::kAllGather: X.out_rows = h.rows; break;
    case Op::kFusedLayer:
    case Op::kFusedHead:
      if (sharded) X.in_rows = X.out_rows = shard_rows(h.num_tokens, world);
      break;
    case Op::kFusedEntry:
      if (sharded) X.out_rows = shard_rows(h.num_tokens, world);
      break;
    default: break;
  }
  // world landing slots and one out slot of one size: a call fits when its larger side fits a
  // slot, so every op holds the same world * slot bytes of tokens.
  X.landing_offset = align_up(world * kAlign, kAlign);
  X.landing_stride = (half_bytes - X.landing_offset) / (world + 1) / kAlign * kAlign;
  X.out_offset = X.landing_offset + world * X.landing_stride;
  const int64_t rows = X.in_rows > X.out_rows ? X.in_rows : X.out_rows;
  X.need = X.landing_offset + (world + 1) * align_up(rows * X.row_bytes, kAlign);
  return X;
}

// Device-local state of one rank (ordinary device memory, zeroed at init). The call counters live
// on the device, not the host, so that a captured CUDA graph advances them on every replay.
struct LocalState {
  uint64_t
      lamport_calls;  // Lamport calls completed: the next one uses mailbox_index(lamport_calls)
  uint64_t exchange_calls;  // barrier-exchanged calls completed: the next uses half_index(...)
  uint32_t lamport_done;   // blocks of the running Lamport kernel that are done (last one advances)
  uint32_t exchange_done;  // blocks of the exchange's last kernel that are done
  uint32_t error_claim;    // the first failing thread of this rank sets it, then fills the record
  uint32_t tile_counter;   // the fused decode finish's last-block counter (resets itself)
  uint64_t epochs[kMaxBlocks];  // barrier epochs reached, per block index
};

enum ErrorCode : uint32_t {
  kNoError = 0,
  kTimeout = 1,     // waited past the group's timeout for `peer`
  kMismatch = 2,    // `peer`'s call header (or Lamport tag) differs from this rank's
  kPeerBroken = 3,  // rank `peer` had already marked the workspace broken
};

// Where a failure happened (ErrorRecord::phase).
enum Phase : uint32_t {
  kPhaseMailbox = 0,  // a Lamport mailbox wait (or tag check)
  kPhaseFirst = 1,    // the first barrier of an exchange (or its header check)
  kPhaseSecond = 2,   // the second barrier
  kPhaseStart = 3,    // the start of a call: the workspace was already broken, the call refused
};

// Written by the first failing thread of a rank into host-mapped memory (fields first, `code`
// last, system fences between), read by the host before every call on the group: no host sync.
struct ErrorRecord {
  uint32_t code;       // ErrorCode; 0 while nothing failed
  int32_t rank;        // the rank that failed to complete a wait
  int32_t peer;        // the rank it waited for (or whose header disagreed)
  int32_t block;       // the block index of the wait
  uint32_t op;         // boundary::Op of the call
  uint32_t phase;      // Phase
  uint64_t epoch;      // the epoch (or Lamport call number) waited for
  uint64_t waited_ns;  // how long it waited
};

// One rank's view of its group: what every symm kernel is given (SymmWorkspace::view() makes it).
struct RankView {
  uint8_t* const* peers;  // device array [world]: every rank's buffer as mapped in this process
  int rank, world;
  LocalState* state;    // device memory
  ErrorRecord* error;   // device address of a host-mapped record
  uint64_t timeout_ns;  // the group's timeout
  BufferLayout L;
};

}  // namespace mhc_sp::symm

#if !defined(__CUDACC_RTC__)
#include <string>
#include <vector>

namespace mhc_sp::symm {

// Host side (transport/symm/host.cpp): pure functions, unit-tested on CPU.

// buffer_layout for a group of `world` ranks, with the arguments checked (ValueError naming them).
BufferLayout checked_buffer_layout(int64_t world, int64_t mailbox_slot_bytes, int64_t half_bytes);

// The peer pointer table a group's kernels use: `ptrs[p]` is rank p's buffer as mapped in this
// process. Checks size, nulls, 16-byte alignment, duplicates and that ptrs[rank] is `local`.
std::vector<int64_t> checked_peer_table(const std::vector<int64_t>& ptrs, int64_t rank,
                                        int64_t world, int64_t local);

// How a call runs on the symm transport.
enum class Path { kLamport, kExchange, kFallback };

// The path of a reduction of `rows` bf16 rows of `inner` elements (replicated boundary or
// all_reduce): Lamport when it fits a mailbox slot beside the tag (and, for the fused layer, has
// at most kLamportMaxTokens rows), the barrier exchange when it fits a half, else the fallback
// (NCCL).
Path reduction_path(const BufferLayout& L, int64_t rows, int64_t inner, bool fused_layer);

// The path of a plain collective `op` over `rows` rows of `row_bytes` bytes (`bf16`: the data is
// bf16, which the reductions require): all_reduce through the mailbox when it fits, else the
// barrier exchange when it fits a half, else the fallback.
Path collective_path(const BufferLayout& L, Op op, int64_t rows, int64_t row_bytes, bool bf16);

// The path of a barrier-exchanged call: kExchange when exchange_layout(h, ...).need fits a half.
Path exchange_path(const BufferLayout& L, const CallHeader& h);

// A failed wait as the ValueError/RuntimeError text the ops raise, naming the peer.
std::string describe_error(const ErrorRecord& e, const std::string& group, double timeout_s);

}  // namespace mhc_sp::symm
#endif
