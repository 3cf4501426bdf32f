// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Lamport mailbox of the symm transport (layout and tags: transport/symm/layout.h):
// decode-sized reductions with no barrier, the data its own signal.
//
// Memory ordering. Pushes are st.relaxed.sys (16 bytes, ptx.cuh), polls ld.relaxed.sys; a torn read
// can only show some lanes still -0, which reads as "not arrived". The poller re-arms each vector
// right after consuming it (the tags: the call's last block, once every block has checked them).
// The next write to that vector is the same source's push three calls later, which needs this
// rank's push of two calls later, which is issued after this kernel ends; every Lamport kernel
// starts with fence.acq_rel.sys in each pushing thread, so the re-arming stores are ordered before
// the pushes that let a peer proceed, and the peer's own fence orders its observation before its
// next pushes.

#include <cuda_runtime.h>

#include "cuda/device/pre.cuh"
#include "transport/symm/device/sync.cuh"

namespace mhc_sp::cuda {

using symm::LamportTag;
using symm::RankView;

// Lamport vectors: V bf16 values moved as one relaxed system-scope access.
template <int V>
struct Mail;

template <>
struct Mail<8> {
  uint4 u;
  __device__ __forceinline__ static Mail load(const void* p) { return Mail{load_relaxed_v4(p)}; }
  __device__ __forceinline__ void store(void* p) const { store_relaxed_v4(p, u); }
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
  __device__ __forceinline__ static Mail load(const void* p) { return Mail{load_relaxed_b16(p)}; }
  __device__ __forceinline__ void store(void* p) const { store_relaxed_b16(p, u); }
  __device__ __forceinline__ static Mail of(const Pack<1>& p) { return Mail{p.u}; }
  __device__ __forceinline__ static Mail armed() { return Mail{symm::kNegZeroBits}; }
  __device__ __forceinline__ bool any_armed() const { return u == symm::kNegZeroBits; }
  __device__ __forceinline__ Mail sendable() const {
    return Mail{u == symm::kNegZeroBits ? uint16_t(0) : u};
  }
  __device__ __forceinline__ void add_to(float (&acc)[1]) const { acc[0] += bf16_bits_to_float(u); }
};

// x for project_block: the fp32 sum, in rank order, of every rank's mailbox slot, rounded once
// to bf16 (so every rank gets the same bits); waits per vector and re-arms what it consumed. When
// the call was refused or a source's tag disagreed (`ok` false, the same in the whole block), x is
// NaN and no slot is read; when a wait fails, that vector is NaN.
struct LamportX {
  uint8_t* mailbox;  // this rank's mailbox of the call: source p at mailbox + p * slot_bytes
  int64_t slot_bytes;
  const RankView* s;
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
__device__ __forceinline__ void lamport_push(const RankView& s, int64_t mailbox,
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
__device__ __forceinline__ void push_lamport_tag(const RankView& s, int64_t mailbox,
                                                 const LamportTag& tag) {
  if (blockIdx.x != 0 || threadIdx.x >= s.world) return;
  Mail<8>::of(tag).store(s.peers[threadIdx.x] + symm::lamport_tag_offset(s.L, mailbox, s.rank));
}

// Every block, before it reads a source's rows: thread p waits for source p's tag and compares it
// with this rank's. true (the whole block) when every source made the same call; otherwise the
// error is recorded and the workspace broken. The tags are re-armed by the call's last block.
__device__ __forceinline__ bool lamport_tags_match(const RankView& s, int64_t mailbox,
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
      break_workspace(s, p);
      failed = true;
    }
  }
  return __syncthreads_or(failed) == 0;
}

// The start of a Lamport call, the same in every block: refused on a broken workspace; otherwise
// this rank's tag and (push()) its rows go into every peer's mailbox before anything is awaited,
// then every source's tag is checked. true: the block may read the mailbox.
template <class Push>
__device__ __forceinline__ bool lamport_start(const RankView& s, uint32_t op, int64_t mailbox,
                                              const LamportTag& tag, uint64_t call, Push&& push) {
  if (refused(s, op, call)) return false;
  fence_acq_rel_sys();
  push_lamport_tag(s, mailbox, tag);
  push();
  return lamport_tags_match(s, mailbox, tag, op, call);
}

// x from this rank's mailbox of the call (NaN when the call did not start: see LamportX).
__device__ __forceinline__ LamportX lamport_x(const RankView& s, int64_t mailbox, uint64_t call,
                                              bool ok) {
  return LamportX{own_buffer(s) + symm::mailbox_slot_offset(s.L, mailbox, 0),
                  s.L.mailbox_slot_bytes,
                  &s,
                  static_cast<int>(blockIdx.x),
                  call,
                  ok};
}

// The last block of a Lamport call re-arms every source's tag in this rank's mailbox of the call.
__device__ __forceinline__ void rearm_lamport_tags(const RankView& s, int64_t mailbox) {
  for (int p = 0; p < s.world; ++p) {
    Mail<8>::armed().store(own_buffer(s) + symm::lamport_tag_offset(s.L, mailbox, p));
  }
}

}  // namespace mhc_sp::cuda
