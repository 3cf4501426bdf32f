// SPDX-License-Identifier: Apache-2.0
// CPU kernels for the mHC math (docs/design.md §1): bf16 in/out, fp32 math, at::vec inner loops,
// at::parallel_for over tokens. Compiled once per instruction set (see CMakeLists.txt) into
// mhc_sp::cpu::MHC_SP_CPU_ISA. CPU_CAPABILITY names at::vec's instance: the AVX-512 builds use
// at::vec's 8-lane AVX2 vectors (under a name of their own, see CMakeLists.txt) and add zmm loops
// that give bitwise the same results.

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "mhc_sp/detail/kernels.h"
#include "mhc_sp/detail/coefficients.h"
#include "mhc_sp/detail/dispatch.h"
#if defined(MHC_SP_CPU_AVX512_EMULATED)
#include "zmm_emulated.h"
#endif

namespace mhc_sp::cpu {
namespace MHC_SP_CPU_ISA {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kV = Vec::size();
constexpr int64_t kV2 = 2 * kV;  // one Vectorized<BFloat16> worth of elements
constexpr int kTokenBlock = 16;  // tokens whose projection shares each fn leaf
constexpr int kMaxRows = kMaxHcMult * (kMaxHcMult + 2);
constexpr int64_t kPostSpan = 2048;        // hidden elements per mhc_post work item
constexpr int64_t kSplitHiddenTokens = 4;  // up to this many tokens, threads split the hidden dim
static_assert(kV == 8, "the lane-sum tree (lane_sum, lane_sums8) is written for 8 fp32 lanes");

// bf16 I/O for elementwise loops: 16 values as two fp32 vectors, in an order that only the
// matching store16 undoes (fp32 operands are loaded in the same order by load16). On AVX2 the
// order is the lanes' own ([0-3, 8-11] and [4-7, 12-15]), so neither the widening (one unpack)
// nor the narrowing (one packus) needs a cross-lane permute. Rounding is round-to-nearest-even,
// as c10::BFloat16.
// One value rounded to bf16 as bf16_bits below does: to nearest-even on the bits; a NaN keeps its
// upper half (its payload, quieted) unless kAnyNaN, which makes it the canonical 0x7fc0.
template <bool kAnyNaN>
inline BFloat16 round_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint32_t bits = kAnyNaN && std::isnan(f) ? 0x7fc0 : (u + 0x7fff + ((u >> 16) & 1)) >> 16;
  return BFloat16(static_cast<uint16_t>(bits), BFloat16::from_bits());
}

#if defined(CPU_CAPABILITY_AVX2)
inline void load16(const BFloat16* p, Vec& a, Vec& b) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  a = Vec(_mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v)));
  b = Vec(_mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v)));
}

inline void load16(const float* p, Vec& a, Vec& b) {
  a = Vec(_mm256_loadu2_m128(p + 8, p));
  b = Vec(_mm256_loadu2_m128(p + 12, p + 4));
}

// bf16 bits in the low half of each 32-bit lane. Adding 0x7fff + odd can carry a NaN's payload
// into its sign or turn it into inf only when the NaN has low bits set, so kAnyNaN selects the
// canonical NaN explicitly; callers whose NaNs can only come from bf16 inputs (low half zero) or
// from the FPU's default NaN skip that select.
template <bool kAnyNaN>
inline __m256i bf16_bits(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  if constexpr (!kAnyNaN) return rounded;
  const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
}

// Rounds a and b to bf16 and stores them; a and b are left holding the rounded values.
template <bool kAnyNaN = true>
inline void store16(BFloat16* p, Vec& a, Vec& b) {
  const __m256i lo = bf16_bits<kAnyNaN>(a), hi = bf16_bits<kAnyNaN>(b);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_packus_epi32(lo, hi));
  a = Vec(_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)));
  b = Vec(_mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
}
#else
// The same order in scalar code, so that the collapse's sum of squares adds as on AVX2.
constexpr int kLoad16Order[2 * kV] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};

template <typename T>
inline void load16(const T* p, Vec& a, Vec& b) {
  float f[2 * kV];
  for (int i = 0; i < 2 * kV; ++i) f[i] = static_cast<float>(p[kLoad16Order[i]]);
  a = Vec::loadu(f);
  b = Vec::loadu(f + kV);
}

// The integer rounding of bf16_bits, NaN rule included.
template <bool kAnyNaN = true>
inline void store16(BFloat16* p, Vec& a, Vec& b) {
  float f[2 * kV];
  a.store(f);
  b.store(f + kV);
  for (int i = 0; i < 2 * kV; ++i) {
    p[kLoad16Order[i]] = round_bits<kAnyNaN>(f[i]);
    f[i] = static_cast<float>(p[kLoad16Order[i]]);
  }
  a = Vec::loadu(f);
  b = Vec::loadu(f + kV);
}
#endif

// a * b + c rounded once, on every instruction set (the default build has no FMA to rely on;
// the kernels are compiled without contraction, so every fused multiply-add is one of these).
inline Vec fmadd(const Vec& a, const Vec& b, const Vec& c) {
#if defined(CPU_CAPABILITY_AVX2)
  return at::vec::fmadd(a, b, c);
#else
  float x[kV], y[kV], z[kV];
  a.store(x);
  b.store(y);
  c.store(z);
  for (int i = 0; i < kV; ++i) z[i] = std::fma(x[i], y[i], z[i]);
  return Vec::loadu(z);
#endif
}

// A NaN coefficient with an arbitrary payload becomes the default NaN, which store16<false> rounds
// correctly (see bf16_bits).
inline float canonical_coefficient(float v) {
  return std::isnan(v) ? std::numeric_limits<float>::quiet_NaN() : v;
}

inline Vec broadcast_coefficient(float v) { return Vec(canonical_coefficient(v)); }

#if defined(MHC_SP_CPU_AVX512)
// ---- AVX-512: two of the 8-lane vectors in one zmm -------------------------------------------
// Every zmm lane does to a value exactly what a lane of the 8-lane code does to it, in the same
// order, so the results are bitwise those of the AVX2 table (docs/design.md §3b). Elementwise
// loops take 32 values per step; the projection holds two tokens' accumulators of one fn row in
// a zmm.
#if defined(MHC_SP_CPU_AVX512_EMULATED)
using namespace zmm_emulated;  // Zmm, Zmmi and the intrinsics below, lane by lane
#else
using Zmm = __m512;
using Zmmi = __m512i;
#if defined(MHC_SP_CPU_AVX512_BF16)
inline Zmmi zmm_bits(__m512bh v) { return reinterpret_cast<Zmmi>(v); }
#endif
#endif
constexpr int64_t kZ2 = 4 * kV;  // 32 values: two of load16's steps

// Qword order of load32 (and its own inverse): the unpacks then give load16's order.
inline Zmmi load32_qwords() { return _mm512_setr_epi64(0, 4, 2, 6, 1, 5, 3, 7); }

// 32 bf16 values as two zmm: a holds load16's (a, b) of values [0, 16) as its low and high half,
// b those of [16, 32), so that a sum over a's lanes then b's adds every value where load16's a or
// b would (the collapse's sum of squares).
inline void load32(const BFloat16* p, Zmm& a, Zmm& b) {
  const Zmmi v = _mm512_permutexvar_epi64(load32_qwords(), _mm512_loadu_si512(p));
  a = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), v));
  b = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), v));
}

inline void load32(const float* p, Zmm& a, Zmm& b) {
  const Zmmi order = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
  a = _mm512_permutexvar_ps(order, _mm512_loadu_ps(p));
  b = _mm512_permutexvar_ps(order, _mm512_loadu_ps(p + 16));
}

// bf16_bits on 16 lanes.
template <bool kAnyNaN>
inline Zmmi bf16_bits(Zmm f) {
  const Zmmi u = _mm512_castps_si512(f);
  const Zmmi odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const Zmmi rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  if constexpr (!kAnyNaN) return rounded;
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc0));
}

// Rounds a and b (load32's order) to bf16 and stores them; with kRounded, a and b are left holding
// the rounded values.
template <bool kAnyNaN = true, bool kRounded = false>
inline void store32(BFloat16* p, Zmm& a, Zmm& b) {
#if defined(MHC_SP_CPU_AVX512_BF16)
  // vcvtne2ps2bf16 rounds to nearest-even as bf16_bits does, but flushes denormal inputs to zero
  // and keeps a NaN's sign and payload: a step holding either (rare) is rounded in software.
  // Without kAnyNaN every NaN has a zero low half, which both round alike.
  constexpr int kSpecial = 0x20 | (kAnyNaN ? 0x81 : 0);  // denormal; quiet and signalling NaN
  if ((_mm512_fpclass_ps_mask(a, kSpecial) | _mm512_fpclass_ps_mask(b, kSpecial)) == 0) {
    const Zmmi r = zmm_bits(_mm512_cvtne2ps_pbh(b, a));            // a's lanes low
    const Zmmi order = _mm512_setr_epi64(0, 2, 1, 3, 4, 6, 5, 7);  // lanes -> memory order
    _mm512_storeu_si512(p, _mm512_permutexvar_epi64(order, r));
    if constexpr (kRounded) {
      auto widen = [](__m256i h) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      };
      a = widen(_mm512_castsi512_si256(r));
      b = widen(_mm512_extracti64x4_epi64(r, 1));
    }
    return;
  }
#endif
  const Zmmi lo = bf16_bits<kAnyNaN>(a), hi = bf16_bits<kAnyNaN>(b);
  _mm512_storeu_si512(p, _mm512_permutexvar_epi64(load32_qwords(), _mm512_packus_epi32(lo, hi)));
  if constexpr (kRounded) {
    a = _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16));
    b = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
  }
}

inline Zmm broadcast_coefficient_zmm(float v) { return _mm512_set1_ps(canonical_coefficient(v)); }
#endif

// Sum of v's kV lanes as ((0+1)+(2+3))+((4+5)+(6+7)): the tree lane_sums8 computes too.
inline float lane_sum(const Vec& v) {
  float l[kV];
  v.store(l);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

inline float round_bf16(float v, BFloat16* dst) {
  *dst = BFloat16(v);
  return static_cast<float>(*dst);
}

// mhc_post for one token over hidden range [h0, h1).
template <int N>
void post_span(const BFloat16* x, const BFloat16* res, int64_t H, const float* post,
               const float* comb, BFloat16* out, int64_t h0, int64_t h1) {
  // Every NaN here comes from a bf16 input or a canonical coefficient: store16 skips the NaN
  // select.
  Vec pv[N], cv[N][N];
  for (int j = 0; j < N; ++j) pv[j] = broadcast_coefficient(post[j]);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < N; ++j) cv[i][j] = broadcast_coefficient(comb[i * N + j]);
  int64_t h = h0;
#if defined(MHC_SP_CPU_AVX512)
  {
    Zmm pz[N], cz[N][N];
    for (int j = 0; j < N; ++j) pz[j] = broadcast_coefficient_zmm(post[j]);
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < N; ++j) cz[i][j] = broadcast_coefficient_zmm(comb[i * N + j]);
    for (; h + kZ2 <= h1; h += kZ2) {
      Zmm xa, xb, ra[N], rb[N];
      load32(x + h, xa, xb);
      for (int i = 0; i < N; ++i) load32(res + i * H + h, ra[i], rb[i]);
      for (int j = 0; j < N; ++j) {
        Zmm oa = _mm512_mul_ps(pz[j], xa), ob = _mm512_mul_ps(pz[j], xb);
        for (int i = 0; i < N; ++i) {
          oa = _mm512_fmadd_ps(cz[i][j], ra[i], oa);
          ob = _mm512_fmadd_ps(cz[i][j], rb[i], ob);
        }
        store32<false>(out + j * H + h, oa, ob);
      }
    }
  }
#endif
  for (; h + kV2 <= h1; h += kV2) {
    Vec xa, xb, ra[N], rb[N];
    load16(x + h, xa, xb);
    for (int i = 0; i < N; ++i) load16(res + i * H + h, ra[i], rb[i]);
    for (int j = 0; j < N; ++j) {
      Vec oa = pv[j] * xa, ob = pv[j] * xb;
      for (int i = 0; i < N; ++i) {
        oa = fmadd(cv[i][j], ra[i], oa);
        ob = fmadd(cv[i][j], rb[i], ob);
      }
      store16<false>(out + j * H + h, oa, ob);
    }
  }
  for (; h < h1; ++h) {
    const float xv = static_cast<float>(x[h]);
    for (int j = 0; j < N; ++j) {
      float o = canonical_coefficient(post[j]) * xv;
      for (int i = 0; i < N; ++i)
        o = std::fma(canonical_coefficient(comb[i * N + j]), static_cast<float>(res[i * H + h]), o);
      out[j * H + h] = round_bits<false>(o);  // as store16<false>
    }
  }
}

// Row t of x over [h0, h1): x's own row, or the rank-order fp32 sum of its parts from +0 rounded
// once to bf16 (see XSource), made in a per-thread row that stays in cache.
const BFloat16* post_x(const PostParams& p, int64_t t, int64_t h0, int64_t h1) {
  if (!p.x.summed()) return p.x.rows + t * p.H;
  thread_local std::vector<BFloat16> row;
  if (static_cast<int64_t>(row.size()) < p.H) row.resize(p.H);
  const int64_t off = t * p.H;
  int64_t h = h0;
#if defined(MHC_SP_CPU_AVX512)
  for (; h + kZ2 <= h1; h += kZ2) {
    Zmm a = _mm512_setzero_ps(), b = _mm512_setzero_ps();  // from +0, as below
    for (int64_t r = 0; r < p.x.part_count; ++r) {
      Zmm c, d;
      load32(p.x.parts[r] + off + h, c, d);
      a = _mm512_add_ps(a, c);
      b = _mm512_add_ps(b, d);
    }
    store32(row.data() + h, a, b);
  }
#endif
  for (; h + kV2 <= h1; h += kV2) {
    Vec a(0.f), b(0.f);  // from +0: a position where every part is -0 sums to +0
    for (int64_t r = 0; r < p.x.part_count; ++r) {
      Vec c, d;
      load16(p.x.parts[r] + off + h, c, d);
      a = a + c;
      b = b + d;
    }
    store16(row.data() + h, a, b);
  }
  for (; h < h1; ++h) {
    float v = 0.f;
    for (int64_t r = 0; r < p.x.part_count; ++r) v += static_cast<float>(p.x.parts[r][off + h]);
    row[h] = BFloat16(v);
  }
  return row.data();
}

void mhc_post(const PostParams& p) {
  const int64_t spans = (p.H + kPostSpan - 1) / kPostSpan;
  // Keep tiny (decode) calls on one thread: waking the pool costs more than the work.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (p.n * std::min(p.H, kPostSpan)));
  dispatch_hc_mult(p.n, [&](auto n_const) {
    constexpr int N = decltype(n_const)::value;
    at::parallel_for(0, p.T * spans, grain, [&](int64_t begin, int64_t end) {
      for (int64_t w = begin; w < end; ++w) {
        const int64_t t = w / spans, h0 = (w % spans) * kPostSpan;
        const int64_t h1 = std::min(p.H, h0 + kPostSpan);
        post_span<N>(post_x(p, t, h0, h1), p.residual + t * N * p.H, p.H, p.post + t * N,
                     p.comb + t * N * N, p.residual_out + t * N * p.H, h0, h1);
      }
    });
  });
}

// Eight bf16 values widened to fp32 in their own order (the projection's dot products need it).
inline Vec widen8(const BFloat16* p) {
#if defined(CPU_CAPABILITY_AVX2)
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return Vec(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)));
#else
  float f[kV];
  for (int64_t i = 0; i < kV; ++i) f[i] = static_cast<float>(p[i]);
  return Vec::loadu(f);
#endif
}

inline Vec widen_partial(const BFloat16* p, int count) {
  float f[kV] = {};
  for (int i = 0; i < count; ++i) f[i] = static_cast<float>(p[i]);
  return Vec::loadu(f);
}

// p[0 .. kV) in a register of its own. Without the empty asm, GCC folds the load into every FMA
// that reads it, loading each fn vector once per token: the tile then needs more loads per cycle
// than the core has ports for.
inline Vec load_once(const float* p) {
  Vec v = Vec::loadu(p);
#if defined(CPU_CAPABILITY_AVX2) && defined(__GNUC__)
  __m256 r = v;
  __asm__("" : "+x"(r));
  v = Vec(r);
#endif
  return v;
}

// ---- The pre family: one summation order for every path -------------------------------------
//
// The projection mix[m] = X . fn[m] and the sum of squares of X are sums over n*H products. Their
// order is fixed by the hidden dimension alone, never by the token count, the token blocking or the
// thread count, so a token's outputs are bitwise the same in every call (batch invariance):
//   leaf (span c)   hidden positions [c*kSpan, (c+1)*kSpan) of every projected stream, accumulated
//                   in fp32 vector lanes (stream by stream, kV positions at a time), the lanes then
//                   added in the tree of lane_sum;
//   mix, squares    the leaves added pairwise over c (tree_sum).
// Short per-lane chains plus pairwise trees also make the projection at least as accurate as a
// blocked fp32 GEMM. Work is split into token blocks (prefill) or span groups (decode); both only
// decide who computes which leaves, never how.

constexpr int64_t kSpan = 128;            // hidden positions per leaf (a multiple of kV2)
constexpr int64_t kSplitSpans = 8;        // leaves per decode work item (and per decode pass)
constexpr int64_t kBlockLeaves = 4;       // leaves per pass of a token block
constexpr int64_t kParallelMacs = 50000;  // smaller decode projections run on one thread
constexpr int64_t kFirstTileRows = 4;     // fn rows in a row tile that also sums the squares
static_assert(kSpan % kV2 == 0, "a leaf holds whole 16-value steps");

// out[j] = lane_sum of the vector at v + j * kV, for j < 8 (three horizontal adds on AVX2).
inline void lane_sums8(const float* v, float* out) {
#if defined(CPU_CAPABILITY_AVX2)
  auto at = [&](int j) { return _mm256_loadu_ps(v + j * kV); };
  const __m256 a = _mm256_hadd_ps(at(0), at(1)), b = _mm256_hadd_ps(at(2), at(3));
  const __m256 c = _mm256_hadd_ps(at(4), at(5)), d = _mm256_hadd_ps(at(6), at(7));
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);  // per 128-bit half
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20),
                                      _mm256_permute2f128_ps(ab, cd, 0x31)));
#else
  for (int j = 0; j < 8; ++j) out[j] = lane_sum(Vec::loadu(v + j * kV));
#endif
}

// Adds `count` arrays of `width` floats, `stride` apart, pairwise into the first: level by level,
// array j absorbs array j + step for every j that is a multiple of 2 * step. The tree depends only
// on count (it splits at the largest power of two below count), each of the `width` sums follows
// it, and the additions run across the width, vectorised. The arrays are overwritten.
inline void tree_sum(float* v, int64_t count, int64_t stride, int64_t width) {
  for (int64_t step = 1; step < count; step *= 2) {
    for (int64_t j = 0; j + step < count; j += 2 * step) {
      float* a = v + j * stride;
      const float* b = a + step * stride;
      for (int64_t e = 0; e < width; ++e) a[e] += b[e];
    }
  }
}

// Adds to a[r][m] the products of `len` positions of token r's row x[r] with fn row m at
// f + m * fstride, kV positions at a time in lane order, and with kSquares to sq[r] the squares
// of x[r]. X is bf16, widened in registers, never staged as fp32.
template <int TR, int MR, bool kSquares>
C10_ALWAYS_INLINE void leaf_steps(Vec (&a)[TR][MR], Vec (&sq)[TR], const BFloat16* const* x,
                                  const float* f, int64_t fstride, int64_t len) {
  int64_t k = 0;
  for (; k + kV <= len; k += kV) {
    Vec xv[TR];
    for (int r = 0; r < TR; ++r) {
      xv[r] = widen8(x[r] + k);
      if constexpr (kSquares) sq[r] = fmadd(xv[r], xv[r], sq[r]);
    }
    for (int m = 0; m < MR; ++m) {
      // One token: each fn vector is read once, so let it fold into the FMA.
      const Vec fv = TR == 1 ? Vec::loadu(f + m * fstride + k) : load_once(f + m * fstride + k);
      for (int r = 0; r < TR; ++r) a[r][m] = fmadd(xv[r], fv, a[r][m]);
    }
  }
  if (k < len) {  // the last leaf of a hidden size that is not a multiple of kV
    const int rest = static_cast<int>(len - k);
    Vec xv[TR];
    for (int r = 0; r < TR; ++r) {
      xv[r] = widen_partial(x[r] + k, rest);
      if constexpr (kSquares) sq[r] = fmadd(xv[r], xv[r], sq[r]);
    }
    for (int m = 0; m < MR; ++m) {
      const Vec fv = Vec::loadu(f + m * fstride + k, rest);
      for (int r = 0; r < TR; ++r) a[r][m] = fmadd(xv[r], fv, a[r][m]);
    }
  }
}

// A TR x MR tile's accumulators: the vector at acc + (r * astride + m) * kV holds the lanes of
// X_r . f_m, the one at acc + (r * astride + sq_slot) * kV those of X_r . X_r.
template <int TR, int MR, bool kSquares>
struct TileAcc {
  Vec a[TR][MR], sq[TR];
  C10_ALWAYS_INLINE void load(bool first, const float* acc, int64_t astride, int64_t sq_slot) {
    for (int r = 0; r < TR; ++r) {
      for (int m = 0; m < MR; ++m)
        a[r][m] = first ? Vec(0.f) : Vec::loadu(acc + (r * astride + m) * kV);
      if constexpr (kSquares)
        sq[r] = first ? Vec(0.f) : Vec::loadu(acc + (r * astride + sq_slot) * kV);
    }
  }
  C10_ALWAYS_INLINE void store(float* acc, int64_t astride, int64_t sq_slot) const {
    for (int r = 0; r < TR; ++r) {
      for (int m = 0; m < MR; ++m) a[r][m].store(acc + (r * astride + m) * kV);
      if constexpr (kSquares) sq[r].store(acc + (r * astride + sq_slot) * kV);
    }
  }
};

#if defined(MHC_SP_CPU_AVX512)
// Tokens 2p and 2p + 1 of a tile in one zmm: token 2p's 8 lanes low, token 2p + 1's high, each
// half exactly the 8-lane accumulator of leaf_steps for that token.
inline Zmm pair(const Vec& lo, const Vec& hi) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

inline Zmm widen8_pair(const BFloat16* lo, const BFloat16* hi) {
  const __m256i v = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// leaf_steps for TP token pairs: the same products added to the same lanes in the same order.
template <int TP, int MR, bool kSquares>
C10_ALWAYS_INLINE void leaf_steps_pairs(Zmm (&a)[TP][MR], Zmm (&sq)[TP], const BFloat16* const* x,
                                        const float* f, int64_t fstride, int64_t len) {
  int64_t k = 0;
  for (; k + kV <= len; k += kV) {
    Zmm xv[TP];
    for (int q = 0; q < TP; ++q) {
      xv[q] = widen8_pair(x[2 * q] + k, x[2 * q + 1] + k);
      if constexpr (kSquares) sq[q] = _mm512_fmadd_ps(xv[q], xv[q], sq[q]);
    }
    for (int m = 0; m < MR; ++m) {
      const Zmm fv = _mm512_broadcast_f32x8(_mm256_loadu_ps(f + m * fstride + k));
      for (int q = 0; q < TP; ++q) a[q][m] = _mm512_fmadd_ps(xv[q], fv, a[q][m]);
    }
  }
  if (k < len) {
    const int rest = static_cast<int>(len - k);
    Zmm xv[TP];
    for (int q = 0; q < TP; ++q) {
      xv[q] = pair(widen_partial(x[2 * q] + k, rest), widen_partial(x[2 * q + 1] + k, rest));
      if constexpr (kSquares) sq[q] = _mm512_fmadd_ps(xv[q], xv[q], sq[q]);
    }
    for (int m = 0; m < MR; ++m) {
      const Zmm fv = _mm512_broadcast_f32x8(Vec::loadu(f + m * fstride + k, rest));
      for (int q = 0; q < TP; ++q) a[q][m] = _mm512_fmadd_ps(xv[q], fv, a[q][m]);
    }
  }
}
#endif

// One stream of leaves [c0, c1) for a TR x MR tile, leaf after leaf; token r's row of the stream at
// x[r] and fn row m of the stream at f + m * fstride, both at leaf c0. Leaf c's accumulators
// are at acc + (c - c0) * cstride * kV; the stream adds to them (or, with `first`, sets them).
template <int TR, int MR, bool kSquares>
void leaf_tile_leaves(const BFloat16* const* x, const float* f, int64_t fstride, int64_t c0,
                      int64_t c1, int64_t H, bool first, float* acc, int64_t cstride,
                      int64_t astride, int64_t sq_slot) {
  auto leaves = [&](auto first_const) {
    constexpr bool kFirst = decltype(first_const)::value;
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t h = (c - c0) * kSpan, len = H - c * kSpan;
      float* ac = acc + (c - c0) * cstride * kV;
      const BFloat16* xc[TR];
      for (int r = 0; r < TR; ++r) xc[r] = x[r] + h;
      TileAcc<TR, MR, kSquares> t;
      t.load(kFirst, ac, astride, sq_slot);
      if (len >= kSpan) {  // a whole leaf: a loop of known length
        leaf_steps<TR, MR, kSquares>(t.a, t.sq, xc, f + h, fstride, kSpan);
      } else {
        leaf_steps<TR, MR, kSquares>(t.a, t.sq, xc, f + h, fstride, len);
      }
      t.store(ac, astride, sq_slot);
    }
  };
  if (first) {
    leaves(std::true_type{});
  } else {
    leaves(std::false_type{});
  }
}

// Tiles of fn rows [m0, m1), each passed to f(m, integral_constant MR, integral_constant squares):
// with `squares`, the first tile (at most 4 rows) also sums the squares; then tiles of 6 rows
// (2 tokens x 6 rows = 12 accumulators hide the FMA latency within 16 vector registers), 4, 2, 1.
template <typename F>
inline void for_row_tiles(int64_t m0, int64_t m1, bool squares, F&& f) {
  using std::integral_constant;
  using Sq = integral_constant<bool, true>;
  using NoSq = integral_constant<bool, false>;
  int64_t m = m0;
  if (squares) {
    switch (std::min<int64_t>(m1 - m0, 4)) {
      case 4: f(m, integral_constant<int, 4>{}, Sq{}); break;
      case 3: f(m, integral_constant<int, 3>{}, Sq{}); break;
      case 2: f(m, integral_constant<int, 2>{}, Sq{}); break;
      default: f(m, integral_constant<int, 1>{}, Sq{}); break;
    }
    m += std::min<int64_t>(m1 - m0, 4);
  }
  for (; m1 - m >= 6 && m1 - m != 8; m += 6) f(m, integral_constant<int, 6>{}, NoSq{});
  for (; m1 - m >= 4; m += 4) f(m, integral_constant<int, 4>{}, NoSq{});
  for (; m1 - m >= 2; m += 2) f(m, integral_constant<int, 2>{}, NoSq{});
  for (; m1 - m >= 1; m += 1) f(m, integral_constant<int, 1>{}, NoSq{});
}

// Per-thread scratch that grows to the largest request and is never freed: no allocation (or
// zeroing) per call. `which` keeps apart buffers that are in use at the same time.
float* scratch(int which, int64_t floats) {
  thread_local std::vector<float> buffers[3];
  std::vector<float>& b = buffers[which];
  if (static_cast<int64_t>(b.size()) < floats) b.resize(floats);
  return b.data();
}

// Where one token's leaves live: [spans][rows + 1], the last entry of a span its sum of squares.
struct LeafLayout {
  int64_t spans, stride, token_stride;
  explicit LeafLayout(const PreParams& p)
      : spans((p.H + kSpan - 1) / kSpan), stride(p.rows + 1), token_stride(spans * (p.rows + 1)) {}
};

#if defined(MHC_SP_CPU_AVX512)
// ---- AVX-512 projection: the accumulators of a leaf in registers over every stream -----------
// A tile of TP token pairs x MR fn rows keeps its zmm accumulators for a whole leaf, stream after
// stream (the order of leaf_tile_leaves, without storing them between streams), then adds their
// lanes straight into the leaves. Up to 10 accumulators per pair, so that the bf16 widening,
// shared by all of a tile's rows, is done for fewer tiles; the widening itself is one word
// permute per step (a zero-masked vpermw of two tokens' 16 values), instead of the insert, the
// widening move and the shift of widen8_pair, all of which compete with the FMAs for ports 0 and 5.
constexpr int kZmmTileAcc = 10;  // accumulators per token pair: 2 pairs use 27 of 32 zmm registers

// Word indices of vpermw: step s of src (token a's 16 values low, token b's high) as widen8_pair
// gives it, each value in the odd word of its lane (the even words are zeroed by the mask).
struct WidenWords {
  alignas(64) uint16_t w[2][32];
};
constexpr WidenWords make_widen_words() {
  WidenWords t{};
  for (int s = 0; s < 2; ++s)
    for (int j = 0; j < 16; ++j)
      t.w[s][2 * j + 1] = static_cast<uint16_t>(j < 8 ? 8 * s + j : 16 + 8 * s + (j - 8));
  return t;
}
constexpr WidenWords kWidenWords = make_widen_words();
constexpr __mmask32 kOddWords = 0xAAAAAAAAu;

// leaf_steps_pairs, 16 positions a step where it can: the same products into the same lanes.
template <int TP, int MR, bool kSquares>
C10_ALWAYS_INLINE void zmm_steps(Zmm (&a)[TP][MR], Zmm (&sq)[TP], const BFloat16* const* x,
                                 const float* f, int64_t fstride, int64_t len) {
  const Zmmi w0 = _mm512_load_si512(kWidenWords.w[0]), w1 = _mm512_load_si512(kWidenWords.w[1]);
  int64_t k = 0;
  for (; k + 2 * kV <= len; k += 2 * kV) {
    Zmmi src[TP];
    for (int q = 0; q < TP; ++q) {
      src[q] = _mm512_inserti64x4(
          _mm512_castsi256_si512(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[2 * q] + k))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[2 * q + 1] + k)), 1);
    }
    for (int s = 0; s < 2; ++s) {
      Zmm xv[TP];
      for (int q = 0; q < TP; ++q) {
        xv[q] = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(kOddWords, s ? w1 : w0, src[q]));
        if constexpr (kSquares) sq[q] = _mm512_fmadd_ps(xv[q], xv[q], sq[q]);
      }
      for (int m = 0; m < MR; ++m) {
        const Zmm fv = _mm512_broadcast_f32x8(_mm256_loadu_ps(f + m * fstride + k + s * kV));
        for (int q = 0; q < TP; ++q) a[q][m] = _mm512_fmadd_ps(xv[q], fv, a[q][m]);
      }
    }
  }
  if (k < len) {
    const BFloat16* xr[2 * TP];
    for (int e = 0; e < 2 * TP; ++e) xr[e] = x[e] + k;
    leaf_steps_pairs<TP, MR, kSquares>(a, sq, xr, f + k, fstride, len - k);
  }
}

// Leaves [c0, c1) of fn rows [m, m + MR) (f: row m of stream 0 at position 0) and, with kSquares,
// the squares (leaf row sq_row), for tokens [r0, r0 + live) of xs (token r's row of stream i at
// xs[r * streams + i]), live <= 2 * TP; a missing token repeats the last one and is dropped.
template <int TP, int MR, bool kSquares>
void leaf_tile_zmm(const BFloat16* const* xs, int64_t streams, int r0, int live, const float* f,
                   int64_t fstride, int64_t H, int64_t c0, int64_t c1, float* leaves,
                   int64_t token_stride, int64_t stride, int64_t m, int64_t sq_row) {
  constexpr int kAcc = MR + kSquares;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t h = c * kSpan, len = std::min(kSpan, H - h);
    Zmm a[TP][MR], sq[TP];
    for (int q = 0; q < TP; ++q) {
      sq[q] = _mm512_setzero_ps();
      for (int j = 0; j < MR; ++j) a[q][j] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < streams; ++i) {
      const BFloat16* x[2 * TP];
      for (int e = 0; e < 2 * TP; ++e) x[e] = xs[(r0 + std::min(e, live - 1)) * streams + i] + h;
      if (len == kSpan) {  // a whole leaf: a loop of known length
        zmm_steps<TP, MR, kSquares>(a, sq, x, f + i * H + h, fstride, kSpan);
      } else {
        zmm_steps<TP, MR, kSquares>(a, sq, x, f + i * H + h, fstride, len);
      }
    }
    // Vector 2 * (q * kAcc + j) + e of v: token 2q + e's lanes of accumulator j.
    alignas(64) float v[TP * kAcc * 2 * kV];
    float sums[TP * kAcc * 2];
    for (int q = 0; q < TP; ++q) {
      for (int j = 0; j < MR; ++j) _mm512_store_ps(v + (q * kAcc + j) * 2 * kV, a[q][j]);
      if constexpr (kSquares) _mm512_store_ps(v + (q * kAcc + MR) * 2 * kV, sq[q]);
    }
    int g = 0;
    for (; g + 8 <= TP * kAcc * 2; g += 8) lane_sums8(v + g * kV, sums + g);
    for (; g < TP * kAcc * 2; ++g) sums[g] = lane_sum(Vec::loadu(v + g * kV));
    for (int e = 0; e < live; ++e) {
      float* out = leaves + (r0 + e) * token_stride + c * stride;
      const int q = e / 2, half = e % 2;
      for (int j = 0; j < MR; ++j) out[m + j] = sums[2 * (q * kAcc + j) + half];
      if constexpr (kSquares) out[sq_row] = sums[2 * (q * kAcc + MR) + half];
    }
  }
}

// f(integral_constant MR, integral_constant squares) for the MR in [1, MaxMR] equal to mr.
template <int MaxMR, typename F>
C10_ALWAYS_INLINE void with_rows(int64_t mr, bool squares, F&& f) {
  if constexpr (MaxMR > 0) {
    if (mr == MaxMR) {
      if (squares) {
        f(std::integral_constant<int, MaxMR>{}, std::true_type{});
      } else {
        f(std::integral_constant<int, MaxMR>{}, std::false_type{});
      }
      return;
    }
    with_rows<MaxMR - 1>(mr, squares, f);
  }
}

// Accumulators per token pair in a tile of TP pairs: with 4 pairs every fn vector loaded serves
// 8 tokens, half the fn bytes per FMA of 2 pairs, in 4 * (5 + 2) + 3 of the 32 zmm registers.
constexpr int zmm_tile_acc(int TP) { return TP >= 4 ? 5 : kZmmTileAcc; }

// Tokens [r0, r1) of project_leaves_zmm in tiles of TP token pairs: rows [m0, m1) and the squares
// in as few tiles of at most zmm_tile_acc(TP) accumulators as hold them, of near-equal size (the
// squares in the first); the last tile of tokens repeats its last token where it runs short.
template <int TP>
void project_tokens_zmm(const PreParams& p, const LeafLayout& L, int64_t streams,
                        const BFloat16* const* xs, int r0, int r1, int64_t c0, int64_t c1,
                        int64_t m0, int64_t m1, bool squares, float* leaves) {
  constexpr int kAcc = zmm_tile_acc(TP);
  const int64_t fstride = streams * p.H;
  const int64_t total = (m1 - m0) + (squares ? 1 : 0);
  const int64_t tiles = (total + kAcc - 1) / kAcc;
  int64_t m = m0;
  for (int64_t t = 0; t < tiles; ++t) {
    const bool sq = squares && t == 0;
    const int64_t mr = total / tiles + (t < total % tiles ? 1 : 0) - (sq ? 1 : 0);
    with_rows<kAcc>(mr, sq, [&](auto mr_const, auto sq_const) {
      constexpr int MR = decltype(mr_const)::value;
      constexpr bool kSquares = decltype(sq_const)::value;
      if constexpr (MR + kSquares <= kAcc) {
        const float* f = p.fn + m * fstride;
        for (int r = r0; r < r1; r += 2 * TP) {
          leaf_tile_zmm<TP, MR, kSquares>(xs, streams, r, std::min(2 * TP, r1 - r), f, fstride, p.H,
                                          c0, c1, leaves, L.token_stride, L.stride, m, p.rows);
        }
      }
    });
    m += mr;
  }
}

// project_leaves on AVX-512: tokens eight at a time where that needs no more row tiles than four
// at a time (hc_head's rows and squares: one tile either way; mhc_pre's 25 would need 5 tiles
// instead of 3, each widening the tokens' bf16 values again, and measures slower), then four at a
// time, then the last one to three in pairs (a lone token paired with itself).
void project_leaves_zmm(const PreParams& p, const LeafLayout& L, int64_t streams,
                        const BFloat16* const* xs, int tb, int64_t c0, int64_t c1, int64_t m0,
                        int64_t m1, bool squares, float* leaves) {
  const int64_t total = (m1 - m0) + (squares ? 1 : 0);
  auto tiles = [&](int acc) { return (total + acc - 1) / acc; };
  const bool eights = tiles(zmm_tile_acc(4)) <= tiles(zmm_tile_acc(2));
  const int r8 = eights ? tb - tb % 8 : 0, r4 = tb - tb % 4;
  if (r8 > 0) project_tokens_zmm<4>(p, L, streams, xs, 0, r8, c0, c1, m0, m1, squares, leaves);
  if (r4 > r8) project_tokens_zmm<2>(p, L, streams, xs, r8, r4, c0, c1, m0, m1, squares, leaves);
  if (tb > r4) project_tokens_zmm<1>(p, L, streams, xs, r4, tb, c0, c1, m0, m1, squares, leaves);
}
#endif

// Leaves [c0, c1) of tokens [0, tb), fn rows [m0, m1) and, with `squares`, the sums of squares:
// leaf c of token r goes to leaves[r * token_stride + c * stride + m] for each such row m, its
// sum of squares to m = rows; token r's row of stream i at xs[r * streams + i]. `acc` holds
// (c1 - c0) * tb * (rows + 1) vectors: slot (c - c0) * tb + r, row m at (slot * (rows + 1) + m).
// Stream by stream, and for each stream and row tile token pair after pair over all the leaves:
// the fn rows a tile reads (a multiple of 4 KiB apart, so in the same cache sets) stay in L1
// while the tokens pass over them, every token row and fn row is read in one run over the
// leaves (which the hardware prefetcher follows), and the accumulators wait in acc between
// streams.
void project_leaves(const PreParams& p, const LeafLayout& L, int64_t streams,
                    const BFloat16* const* xs, int tb, int64_t c0, int64_t c1, int64_t m0,
                    int64_t m1, bool squares, float* leaves, float* acc) {
#if defined(MHC_SP_CPU_AVX512)
  project_leaves_zmm(p, L, streams, xs, tb, c0, c1, m0, m1, squares, leaves);
  return;
#endif
  const int64_t rows = p.rows, fstride = streams * p.H, astride = rows + 1;
  for (int64_t i = 0; i < streams; ++i) {
    const bool first = i == 0;
    for_row_tiles(m0, m1, squares, [&](int64_t m, auto mr, auto sq) {
      constexpr int MR = decltype(mr)::value;
      constexpr bool kSquares = decltype(sq)::value;
      const float* f = p.fn + i * p.H + m * fstride + c0 * kSpan;
      float* am = acc + m * kV;
      auto tile = [&](int r, auto tr) {  // tokens [r, r + TR)
        constexpr int TR = decltype(tr)::value;
        const BFloat16* x[TR];
        for (int j = 0; j < TR; ++j) x[j] = xs[(r + j) * streams + i] + c0 * kSpan;
        leaf_tile_leaves<TR, MR, kSquares>(x, f, fstride, c0, c1, p.H, first, am + r * astride * kV,
                                           tb * astride, astride, rows - m);
      };
      int r = 0;
      for (; r + 2 <= tb; r += 2) tile(r, std::integral_constant<int, 2>{});
      if (r < tb) tile(r, std::integral_constant<int, 1>{});
    });
  }
  // The lane sums of the rows this call made, into the leaves.
  if (m0 == 0 && m1 == rows && squares) {  // every row: the slots' vectors are contiguous
    float* sums = scratch(2, (c1 - c0) * tb * astride);
    const int64_t vectors = (c1 - c0) * tb * astride;
    int64_t g = 0;
    for (; g + 8 <= vectors; g += 8) lane_sums8(acc + g * kV, sums + g);
    for (; g < vectors; ++g) sums[g] = lane_sum(Vec::loadu(acc + g * kV));
    for (int64_t c = c0; c < c1; ++c) {
      for (int r = 0; r < tb; ++r) {
        const float* from = sums + ((c - c0) * tb + r) * astride;
        std::copy(from, from + astride, leaves + r * L.token_stride + c * L.stride);
      }
    }
    return;
  }
  for (int64_t c = c0; c < c1; ++c) {
    for (int r = 0; r < tb; ++r) {
      const float* v = acc + ((c - c0) * tb + r) * astride * kV;
      float* out = leaves + r * L.token_stride + c * L.stride;
      int64_t m = m0;
      for (; m + 8 <= m1; m += 8) lane_sums8(v + m * kV, out + m);
      for (; m < m1; ++m) out[m] = lane_sum(Vec::loadu(v + m * kV));
      if (squares) out[rows] = lane_sum(Vec::loadu(v + rows * kV));
    }
  }
}

// Leaves [c0, c1), rows [m0, m1) (and the squares with `squares`) of tokens [t0, t0 + tb);
// leaves points at token t0's first leaf. First, token by token, `produce(t, h0, h1)` makes
// token t's projected rows `proj_row(t, i)` ready over [h0, h1) (mhc_post_pre: runs the post; a
// no-op when they are the input); then the projection, a few leaves at a time.
template <typename Produce, typename ProjRow>
void compute_leaves(const PreParams& p, const LeafLayout& L, int64_t streams, int64_t t0, int tb,
                    int64_t c0, int64_t c1, int64_t m0, int64_t m1, bool squares, float* leaves,
                    Produce&& produce, ProjRow&& proj_row) {
  for (int r = 0; r < tb; ++r) produce(t0 + r, c0 * kSpan, std::min(p.H, c1 * kSpan));
  const BFloat16* xs[kTokenBlock * kMaxHcMult];
  for (int r = 0; r < tb; ++r)
    for (int64_t i = 0; i < streams; ++i) xs[r * streams + i] = proj_row(t0 + r, i);
  const int64_t per_call = tb <= kSplitHiddenTokens ? kSplitSpans : kBlockLeaves;
  float* acc = scratch(1, per_call * tb * (p.rows + 1) * kV);
  for (int64_t b = c0; b < c1; b += per_call) {
    project_leaves(p, L, streams, xs, tb, b, std::min(c1, b + per_call), m0, m1, squares, leaves,
                   acc);
  }
}

// out = bf16(sum_i pre[i] * stream_i), then with kNorm the fused RMSNorm on float(out).
template <int N, bool kNorm>
void collapse(const BFloat16* const* streams, const float* pre, int64_t H, const float* norm_weight,
              float norm_eps, BFloat16* out) {
  Vec pv[N];
  const BFloat16* rows[N];  // a copy the stores to out cannot alias
  for (int i = 0; i < N; ++i) {
    pv[i] = Vec(pre[i]);
    rows[i] = streams[i];
  }
  Vec sqa(0.f), sqb(0.f);
  int64_t h = 0;
#if defined(MHC_SP_CPU_AVX512)
  if (H >= kZ2) {
    Zmm pz[N];
    for (int i = 0; i < N; ++i) pz[i] = _mm512_set1_ps(pre[i]);
    Zmm sq = _mm512_setzero_ps();  // sqa in the low half, sqb in the high (see load32)
    for (; h + kZ2 <= H; h += kZ2) {
      Zmm ya = _mm512_setzero_ps(), yb = _mm512_setzero_ps();
      for (int i = 0; i < N; ++i) {
        Zmm a, b;
        load32(rows[i] + h, a, b);
        ya = _mm512_fmadd_ps(pz[i], a, ya);
        yb = _mm512_fmadd_ps(pz[i], b, yb);
      }
      store32<false, kNorm>(out + h, ya, yb);
      if constexpr (kNorm) {
        sq = _mm512_fmadd_ps(ya, ya, sq);
        sq = _mm512_fmadd_ps(yb, yb, sq);
      }
    }
    sqa = Vec(_mm512_castps512_ps256(sq));
    sqb = Vec(_mm512_extractf32x8_ps(sq, 1));
  }
#endif
  for (; h + kV2 <= H; h += kV2) {
    Vec ya(0.f), yb(0.f);
    for (int i = 0; i < N; ++i) {
      Vec a, b;
      load16(rows[i] + h, a, b);
      ya = fmadd(pv[i], a, ya);
      yb = fmadd(pv[i], b, yb);
    }
    store16<false>(out + h, ya, yb);  // NaNs here come from bf16 inputs or the FPU (see bf16_bits)
    if constexpr (kNorm) {
      sqa = fmadd(ya, ya, sqa);
      sqb = fmadd(yb, yb, sqb);
    }
  }
  float sq_tail = 0.f;
  for (; h < H; ++h) {
    float y = 0.f;
    for (int i = 0; i < N; ++i) y = std::fma(pre[i], static_cast<float>(streams[i][h]), y);
    const float r = round_bf16(y, out + h);
    sq_tail = std::fma(r, r, sq_tail);
  }
  if constexpr (!kNorm) return;
  const float total = lane_sum(sqa + sqb) + sq_tail;
  const float inv = 1.0f / std::sqrt(total / static_cast<float>(H) + norm_eps);
  const Vec iv(inv);
  h = 0;
#if defined(MHC_SP_CPU_AVX512)
  const Zmm iz = _mm512_set1_ps(inv);
  for (; h + kZ2 <= H; h += kZ2) {
    Zmm a, b, wa, wb;
    load32(out + h, a, b);
    load32(norm_weight + h, wa, wb);
    a = _mm512_mul_ps(_mm512_mul_ps(a, iz), wa);
    b = _mm512_mul_ps(_mm512_mul_ps(b, iz), wb);
    store32(out + h, a, b);
  }
#endif
  for (; h + kV2 <= H; h += kV2) {
    Vec a, b, wa, wb;
    load16(out + h, a, b);
    load16(norm_weight + h, wa, wb);
    a = a * iv * wa;
    b = b * iv * wb;
    store16(out + h, a, b);
  }
  for (; h < H; ++h) round_bf16(static_cast<float>(out[h]) * inv * norm_weight[h], out + h);
}

// Tokens [t0, t0 + tb) from their leaves (consumed): mix and squares (tree_sum over spans), the
// coefficients, then the collapse of token t's rows `stream_row(t, i)` into p.out.
template <typename StreamRow>
void finish_tokens(const PreParams& p, const LeafLayout& L, int64_t streams, int64_t t0, int tb,
                   float* leaves, StreamRow&& stream_row) {
  const float count = static_cast<float>(streams * p.H);
  for (int r = 0; r < tb; ++r) {
    const int64_t t = t0 + r;
    const float* mix = leaves + r * L.token_stride;
    tree_sum(leaves + r * L.token_stride, L.spans, L.stride, L.stride);
    const float squares = mix[p.rows];
    float pre[kMaxHcMult];
    const float inv_rms = 1.0f / std::sqrt(squares / count + p.s.rms_eps);
    if (p.post) {
      mhc_coefficients(mix, inv_rms, p.scale, p.base, static_cast<int>(p.n), p.s, pre,
                       p.post + t * p.n, p.comb + t * p.n * p.n);
    } else {
      pre_weights(mix, inv_rms, p.scale[0], p.base, static_cast<int>(p.n), p.s.hc_pre_eps, pre);
    }
    const BFloat16* rows[kMaxHcMult];
    for (int64_t i = 0; i < p.n; ++i) rows[i] = stream_row(t, i);
    dispatch_hc_mult(p.n, [&](auto n_const) {
      constexpr int N = decltype(n_const)::value;
      if (p.norm_weight) {
        collapse<N, true>(rows, pre, p.H, p.norm_weight, p.s.norm_eps, p.out + t * p.H);
      } else {
        collapse<N, false>(rows, pre, p.H, nullptr, 0.f, p.out + t * p.H);
      }
    });
  }
}

// `produce` of calls whose projected rows are their input.
struct RowsReady {
  void operator()(int64_t, int64_t, int64_t) const {}
};

// The pre of every token. Decode-size calls (T <= kSplitHiddenTokens) have too few tokens to give
// every thread a block. When the projected rows are the input, threads take a share of the fn
// rows over the whole hidden dim: each thread reads the same part of fn in every call, a part
// spread over all cache sets, so that it can stay in the thread's L2 (a share of the hidden dim
// would fall on a fraction of the sets, fn's rows being a multiple of 4 KiB apart). Otherwise
// threads take groups of leaves of all tokens, producing the rows they project; so they do too
// for hc_head's few rows, whose fn is small enough that a share of the hidden dim stays in L2
// all the same. Larger calls give each thread whole blocks of tokens, whose rows stay in cache
// from their production through the projection to the collapse.
template <typename Produce, typename ProjRow, typename StreamRow>
void pre_tokens(const PreParams& p, int64_t streams, Produce&& produce, ProjRow&& proj_row,
                StreamRow&& stream_row) {
  const LeafLayout L(p);
  if (p.T <= kSplitHiddenTokens) {
    const int tb = static_cast<int>(p.T);
    float* leaves = scratch(0, tb * L.token_stride);
    // Waking the other threads costs more than a small projection (a 4-row hc_head of one token
    // at H = 4096, 65536 multiply-adds, already gains: 7.2-7.5 us on 2 threads against 8.0-8.7).
    const bool small = p.T * p.rows * streams * p.H < kParallelMacs;
    // hc_head's few rows (all of them and the squares in one tile) would leave each thread
    // widening every stream value for one or two rows: there the threads take leaves instead.
    constexpr bool kRowsReady = std::is_same_v<std::decay_t<Produce>, RowsReady>;
    if (kRowsReady && p.rows > kFirstTileRows) {
      const int64_t parts = small ? 1 : std::clamp<int64_t>(at::get_num_threads(), 1, p.rows);
      at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
        for (int64_t q = begin; q < end; ++q) {
          compute_leaves(p, L, streams, 0, tb, 0, L.spans, q * p.rows / parts,
                         (q + 1) * p.rows / parts, q == 0, leaves, produce, proj_row);
        }
      });
    } else {
      const int64_t groups = (L.spans + kSplitSpans - 1) / kSplitSpans;
      at::parallel_for(0, groups, small ? groups : 1, [&](int64_t begin, int64_t end) {
        for (int64_t g = begin; g < end; ++g) {
          compute_leaves(p, L, streams, 0, tb, g * kSplitSpans,
                         std::min(L.spans, (g + 1) * kSplitSpans), 0, p.rows, true, leaves, produce,
                         proj_row);
        }
      });
    }
    finish_tokens(p, L, streams, 0, tb, leaves, stream_row);
    return;
  }
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t tb = std::clamp<int64_t>((p.T + threads - 1) / threads, 1, kTokenBlock);
  const int64_t blocks = (p.T + tb - 1) / tb;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    float* leaves = scratch(0, tb * L.token_stride);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t t0 = b * tb;
      const int n = static_cast<int>(std::min<int64_t>(tb, p.T - t0));
      compute_leaves(p, L, streams, t0, n, 0, L.spans, 0, p.rows, true, leaves, produce, proj_row);
      finish_tokens(p, L, streams, t0, n, leaves, stream_row);
    }
  });
}

// mhc_pre and hc_head (rows = n, no post/comb): project and collapse the input stream itself.
void pre_from_stream(const BFloat16* residual, const PreParams& p) {
  auto row = [&](int64_t t, int64_t i) { return residual + (t * p.n + i) * p.H; };
  pre_tokens(p, p.n, RowsReady{}, row, row);
}

void mhc_pre(const BFloat16* residual, const PreParams& p) { pre_from_stream(residual, p); }

void hc_head(const BFloat16* residual, const PreParams& p) { pre_from_stream(residual, p); }

void mhc_post_pre(const PostParams& q, const PreParams& p) {
  dispatch_hc_mult(p.n, [&](auto n_const) {
    constexpr int N = decltype(n_const)::value;
    auto out_row = [&](int64_t t, int64_t i) { return q.residual_out + (t * N + i) * p.H; };
    auto post = [&](int64_t t, int64_t h0, int64_t h1) {
      post_span<N>(post_x(q, t, h0, h1), q.residual + t * N * p.H, p.H, q.post + t * N,
                   q.comb + t * N * N, q.residual_out + t * N * p.H, h0, h1);
    };
    pre_tokens(p, N, post, out_row, out_row);
  });
}

void mhc_pre_broadcast(const BFloat16* x, BFloat16* residual_out, const PreParams& p) {
  auto x_row = [&](int64_t t, int64_t) { return x + t * p.H; };
  auto broadcast = [&](int64_t t, int64_t h0, int64_t h1) {
    for (int64_t i = 0; i < p.n; ++i)
      std::copy(x_row(t, i) + h0, x_row(t, i) + h1, residual_out + (t * p.n + i) * p.H + h0);
  };
  pre_tokens(p, 1, broadcast, x_row, x_row);
}

const KernelTable table{
    .name = "cpu-" C10_STRINGIZE(MHC_SP_CPU_ISA),
    .mhc_post = mhc_post,
    .mhc_pre = mhc_pre,
    .mhc_post_pre = mhc_post_pre,
    .mhc_pre_broadcast = mhc_pre_broadcast,
    .hc_head = hc_head,
};

}  // namespace MHC_SP_CPU_ISA
}  // namespace mhc_sp::cpu
