// SPDX-License-Identifier: Apache-2.0
// Host-side logic of the symm transport that needs no GPU: the pointer table's checks, which path
// a call takes, the text of a failed wait and the order of calls across streams. Compiled in every
// build, so CPU tests cover it.

#include <c10/util/Exception.h>

#include <algorithm>
#include <unordered_set>

#include "transport/symm/layout.h"

namespace mhc_sp::symm {

std::vector<int64_t> checked_peer_table(const std::vector<int64_t>& ptrs, int64_t rank,
                                        int64_t world, int64_t local) {
  TORCH_CHECK_VALUE(world >= 1 && world <= kMaxRanks, "world: the symm transport takes 1 to ",
                    kMaxRanks, " ranks, got ", world);
  TORCH_CHECK_VALUE(rank >= 0 && rank < world, "rank: expected a value in [0, ", world, "), got ",
                    rank);
  TORCH_CHECK_VALUE(static_cast<int64_t>(ptrs.size()) == world, "peer_ptrs: expected ", world,
                    " pointers (one per rank), got ", ptrs.size());
  std::unordered_set<int64_t> seen;
  for (int64_t p = 0; p < world; ++p) {
    const int64_t v = ptrs[p];
    TORCH_CHECK_VALUE(v != 0, "peer_ptrs: rank ", p, "'s buffer is not mapped (null pointer)");
    TORCH_CHECK_VALUE(v % 16 == 0, "peer_ptrs: rank ", p, "'s buffer at 0x", std::hex, v,
                      " is not 16-byte aligned");
    TORCH_CHECK_VALUE(seen.insert(v).second, "peer_ptrs: rank ", p,
                      "'s buffer is mapped at the same address as another rank's");
  }
  TORCH_CHECK_VALUE(ptrs[rank] == local, "peer_ptrs: entry ", rank,
                    " (this rank) must be this rank's own buffer");
  return ptrs;
}

BufferLayout checked_buffer_layout(int64_t world, int64_t mailbox_slot_bytes, int64_t half_bytes) {
  TORCH_CHECK_VALUE(world >= 1 && world <= kMaxRanks, "world: the symm transport takes 1 to ",
                    kMaxRanks, " ranks, got ", world);
  TORCH_CHECK_VALUE(mailbox_slot_bytes >= 16, "mailbox_slot_bytes: expected at least 16, got ",
                    mailbox_slot_bytes);
  TORCH_CHECK_VALUE(half_bytes >= kPage, "half_bytes: expected at least ", kPage, ", got ",
                    half_bytes);
  return buffer_layout(world, mailbox_slot_bytes, half_bytes);
}

Path reduction_path(const BufferLayout& L, int64_t rows, int64_t inner, bool fused_layer) {
  const int64_t bytes = rows * inner * 2;
  const bool lamport_rows = !fused_layer || rows <= kLamportMaxTokens;
  if (rows >= 1 && inner % 8 == 0 && lamport_rows && bytes <= lamport_row_bytes(L)) {
    return Path::kLamport;
  }
  CallHeader h{};
  h.op = static_cast<uint32_t>(Op::kAllReduce);
  h.rows = rows;
  h.inner = inner * 2;
  h.elem_bytes = 1;
  return inner % 8 == 0 ? exchange_path(L, h) : Path::kFallback;
}

Path collective_path(const BufferLayout& L, Op op, int64_t rows, int64_t row_bytes, bool bf16) {
  if (rows < 1 || row_bytes < 1) return Path::kFallback;
  if (op != Op::kAllGather && !bf16) return Path::kFallback;  // the kernels sum bf16 only
  if (op == Op::kAllReduce && reduction_path(L, 1, rows * row_bytes / 2, false) == Path::kLamport) {
    return Path::kLamport;
  }
  CallHeader h{};
  h.op = static_cast<uint32_t>(op);
  h.rows = rows;
  h.num_tokens = -1;
  h.inner = row_bytes;
  h.elem_bytes = 1;
  return exchange_path(L, h);
}

Path exchange_path(const BufferLayout& L, const CallHeader& h) {
  const ExchangeLayout X = exchange_layout(h, L.world, L.half_bytes);
  if (X.row_bytes % 16 != 0) return Path::kFallback;  // the kernels move 16-byte vectors
  return X.need <= L.half_bytes ? Path::kExchange : Path::kFallback;
}

std::string describe_error(const ErrorRecord& e, const std::string& group, double timeout_s) {
  static const char* const kPhases[] = {"the Lamport mailbox", "the first barrier",
                                        "the second barrier", "the start of a call"};
  const char* phase = e.phase <= kPhaseStart ? kPhases[e.phase] : "a wait";
  const std::string where = c10::str("group '", group, "' (symm transport): rank ", e.rank,
                                     ", block ", e.block, ", ", phase, " of epoch ", e.epoch);
  std::string what;
  switch (e.code) {
    case kTimeout:
      what = c10::str("timed out after ", static_cast<double>(e.waited_ns) * 1e-9, " s (timeout ",
                      timeout_s, " s) waiting for rank ", e.peer);
      break;
    case kMismatch:
      what =
          c10::str("rank ", e.peer,
                   " made a different call (another op, token count, hidden size or call order)");
      break;
    case kPeerBroken:
      what = e.phase == kPhaseStart
                 ? c10::str("refused the call (its outputs are NaN): rank ", e.peer,
                            " had marked the workspace broken")
                 : c10::str("gave up: rank ", e.peer, " had marked the workspace broken");
      break;
    default: what = c10::str("failed with code ", e.code);
  }
  return c10::str(where, ": ", what,
                  ". The workspace is broken; every later call on this group raises. Re-create the "
                  "process group and call mhc_sp.distributed.init again.");
}

}  // namespace mhc_sp::symm
