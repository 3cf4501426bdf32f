// SPDX-License-Identifier: Apache-2.0
// The AVX-512 intrinsics that csrc/cpu/mhc_kernels.cpp uses, written out lane by lane from their
// definitions in Intel's Software Developer's Manual, for the testing build's emulated tables
// (avx512_emulated, avx512_bf16_emulated): the kernels' AVX-512 source compiled for an AVX2 CPU, so
// that the cross-table tests check its summation order and bf16 rounding bit for bit on machines
// without AVX-512 (tests/ops/test_kernel_tables.py). Only the results are emulated, not the speed.
//
// The kernels name the types Zmm, Zmmi and Zmmbh and call the intrinsics unqualified; bringing
// zmm_emulated into the table's namespace (mhc_sp::cpu::MHC_SP_CPU_ISA, which holds it so that
// every function of a table carries the table's name) makes those calls find these functions
// before the compiler's own, whose macros are undefined here. Every lane is computed as the
// instruction computes it with MXCSR at its default (round to nearest even, no flush to zero, no
// denormals-are-zero); arithmetic on a NaN returns a quiet NaN, and which operand's payload
// survives when several are NaN may differ from the hardware's (the tests allow it, as they do
// between instruction forms).
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#undef _mm512_setr_epi64
#undef _mm512_setr_epi32
#undef _mm512_srli_epi32
#undef _mm512_slli_epi32
#undef _mm512_cmp_ps_mask
#undef _mm512_fpclass_ps_mask
#undef _mm512_insertf32x8
#undef _mm512_inserti64x4
#undef _mm512_extractf32x8_ps
#undef _mm512_extracti64x4_epi64

namespace mhc_sp::cpu::MHC_SP_CPU_ISA::zmm_emulated {

// 16 fp32 lanes; 512 bits as 16 dwords (words and qwords through lanes_as / from_lanes); 32 bf16.
struct Zmm {
  alignas(64) float f[16];
};
struct Zmmi {
  alignas(64) uint32_t d[16];
};
struct Zmmbh {
  alignas(64) uint16_t w[32];
};

// The 512 bits of v as 64 / sizeof(T) lanes of T, and back.
template <typename T>
struct Lanes {
  T v[64 / sizeof(T)];
};
template <typename T, typename Z>
inline Lanes<T> lanes_as(const Z& z) {
  static_assert(sizeof(Z) == 64, "a zmm register is 64 bytes");
  Lanes<T> l;
  std::memcpy(l.v, &z, 64);
  return l;
}
template <typename Z, typename T>
inline Z from_lanes(const Lanes<T>& l) {
  Z z;
  std::memcpy(&z, l.v, 64);
  return z;
}

// ---- Set, load, store ------------------------------------------------------------------------
inline Zmm _mm512_setzero_ps() { return Zmm{}; }
inline Zmmi _mm512_setzero_si512() { return Zmmi{}; }

inline Zmm _mm512_set1_ps(float v) {
  Zmm z;
  for (int i = 0; i < 16; ++i) z.f[i] = v;
  return z;
}

inline Zmmi _mm512_set1_epi32(int v) {
  Zmmi z;
  for (int i = 0; i < 16; ++i) z.d[i] = static_cast<uint32_t>(v);
  return z;
}

// Element 0 first (lowest lane), as the setr forms list them.
inline Zmmi _mm512_setr_epi64(int64_t e0, int64_t e1, int64_t e2, int64_t e3, int64_t e4,
                              int64_t e5, int64_t e6, int64_t e7) {
  const Lanes<int64_t> l{{e0, e1, e2, e3, e4, e5, e6, e7}};
  return from_lanes<Zmmi>(l);
}

inline Zmmi _mm512_setr_epi32(int e0, int e1, int e2, int e3, int e4, int e5, int e6, int e7,
                              int e8, int e9, int e10, int e11, int e12, int e13, int e14,
                              int e15) {
  const Lanes<int32_t> l{{e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15}};
  return from_lanes<Zmmi>(l);
}

inline Zmm _mm512_loadu_ps(const void* p) {
  Zmm z;
  std::memcpy(z.f, p, 64);
  return z;
}

inline Zmmi _mm512_loadu_si512(const void* p) {
  Zmmi z;
  std::memcpy(z.d, p, 64);
  return z;
}

// The aligned forms fault on an address that is not 64-byte aligned: so does this one.
inline Zmmi _mm512_load_si512(const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 64 != 0) __builtin_trap();
  return _mm512_loadu_si512(p);
}

inline void _mm512_storeu_si512(void* p, const Zmmi& v) { std::memcpy(p, v.d, 64); }

inline void _mm512_store_ps(void* p, const Zmm& v) {
  if (reinterpret_cast<uintptr_t>(p) % 64 != 0) __builtin_trap();
  std::memcpy(p, v.f, 64);
}

// ---- Casts, inserts, extracts, broadcasts -----------------------------------------------------
inline Zmm _mm512_castsi512_ps(const Zmmi& v) { return from_lanes<Zmm>(lanes_as<uint32_t>(v)); }
inline Zmmi _mm512_castps_si512(const Zmm& v) { return from_lanes<Zmmi>(lanes_as<uint32_t>(v)); }

inline __m256 _mm512_castps512_ps256(const Zmm& v) { return _mm256_loadu_ps(v.f); }

inline __m256i _mm512_castsi512_si256(const Zmmi& v) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v.d));
}

// The upper half is undefined in the instruction; zero here.
inline Zmm _mm512_castps256_ps512(__m256 v) {
  Zmm z{};
  _mm256_storeu_ps(z.f, v);
  return z;
}

inline Zmmi _mm512_castsi256_si512(__m256i v) {
  Zmmi z{};
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(z.d), v);
  return z;
}

// Bit 0 of imm picks the 256-bit half.
inline Zmm _mm512_insertf32x8(Zmm a, __m256 b, int imm) {
  _mm256_storeu_ps(a.f + 8 * (imm & 1), b);
  return a;
}

inline Zmmi _mm512_inserti64x4(Zmmi a, __m256i b, int imm) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.d + 8 * (imm & 1)), b);
  return a;
}

inline __m256 _mm512_extractf32x8_ps(const Zmm& a, int imm) {
  return _mm256_loadu_ps(a.f + 8 * (imm & 1));
}

inline __m256i _mm512_extracti64x4_epi64(const Zmmi& a, int imm) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.d + 8 * (imm & 1)));
}

inline Zmm _mm512_broadcast_f32x8(__m256 v) {
  Zmm z;
  _mm256_storeu_ps(z.f, v);
  _mm256_storeu_ps(z.f + 8, v);
  return z;
}

// Zero-extends 16 words to 16 dwords.
inline Zmmi _mm512_cvtepu16_epi32(__m256i v) {
  uint16_t w[16];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(w), v);
  Zmmi z;
  for (int i = 0; i < 16; ++i) z.d[i] = w[i];
  return z;
}

// ---- Arithmetic ------------------------------------------------------------------------------
// Lane i of the result is f(lane i of each operand).
template <typename Z, typename F, typename... Zs>
inline Z lanewise(F f, const Z& a, const Zs&... rest) {
  Z z;
  if constexpr (std::is_same_v<Z, Zmm>) {
    for (int i = 0; i < 16; ++i) z.f[i] = f(a.f[i], rest.f[i]...);
  } else {
    for (int i = 0; i < 16; ++i) z.d[i] = f(a.d[i], rest.d[i]...);
  }
  return z;
}

inline Zmm _mm512_add_ps(const Zmm& a, const Zmm& b) {
  return lanewise([](float x, float y) { return x + y; }, a, b);
}

inline Zmm _mm512_mul_ps(const Zmm& a, const Zmm& b) {
  return lanewise([](float x, float y) { return x * y; }, a, b);
}

// a * b + c rounded once.
inline Zmm _mm512_fmadd_ps(const Zmm& a, const Zmm& b, const Zmm& c) {
  return lanewise([](float x, float y, float w) { return std::fma(x, y, w); }, a, b, c);
}

inline Zmmi _mm512_add_epi32(const Zmmi& a, const Zmmi& b) {
  return lanewise([](uint32_t x, uint32_t y) { return x + y; }, a, b);
}

inline Zmmi _mm512_and_si512(const Zmmi& a, const Zmmi& b) {
  return lanewise([](uint32_t x, uint32_t y) { return x & y; }, a, b);
}

// Logical shifts; a count above 31 gives 0.
inline Zmmi _mm512_srli_epi32(const Zmmi& a, unsigned imm) {
  return lanewise([imm](uint32_t x) { return imm > 31 ? 0u : x >> imm; }, a);
}

inline Zmmi _mm512_slli_epi32(const Zmmi& a, unsigned imm) {
  return lanewise([imm](uint32_t x) { return imm > 31 ? 0u : x << imm; }, a);
}

// ---- Masks, compares, classes ----------------------------------------------------------------
// Only the predicate the kernels use: unordered (either operand NaN), quiet.
inline __mmask16 _mm512_cmp_ps_mask(const Zmm& a, const Zmm& b, int predicate) {
  if (predicate != _CMP_UNORD_Q) __builtin_trap();
  __mmask16 k = 0;
  for (int i = 0; i < 16; ++i)
    if (std::isnan(a.f[i]) || std::isnan(b.f[i])) k |= static_cast<__mmask16>(1u << i);
  return k;
}

inline Zmmi _mm512_mask_mov_epi32(const Zmmi& src, __mmask16 k, const Zmmi& a) {
  Zmmi z;
  for (int i = 0; i < 16; ++i) z.d[i] = (k >> i) & 1 ? a.d[i] : src.d[i];
  return z;
}

// imm's bits select the classes: 0x01 quiet NaN, 0x02 +0, 0x04 -0, 0x08 +inf, 0x10 -inf,
// 0x20 denormal, 0x40 finite negative, 0x80 signalling NaN.
inline __mmask16 _mm512_fpclass_ps_mask(const Zmm& a, int imm) {
  __mmask16 k = 0;
  for (int i = 0; i < 16; ++i) {
    uint32_t u;
    std::memcpy(&u, &a.f[i], 4);
    const bool neg = u >> 31, exp_max = ((u >> 23) & 0xff) == 0xff,
               exp_zero = ((u >> 23) & 0xff) == 0;
    const uint32_t frac = u & 0x7fffff;
    const bool qnan = exp_max && (frac & 0x400000), snan = exp_max && frac && !(frac & 0x400000);
    const bool inf = exp_max && !frac, zero = exp_zero && !frac, denormal = exp_zero && frac;
    const bool hit = ((imm & 0x01) && qnan) || ((imm & 0x02) && zero && !neg) ||
                     ((imm & 0x04) && zero && neg) || ((imm & 0x08) && inf && !neg) ||
                     ((imm & 0x10) && inf && neg) || ((imm & 0x20) && denormal) ||
                     ((imm & 0x40) && neg && !exp_max) || ((imm & 0x80) && snan);
    if (hit) k |= static_cast<__mmask16>(1u << i);
  }
  return k;
}

// ---- Permutes, unpacks, packs ----------------------------------------------------------------
inline Zmmi _mm512_permutexvar_epi64(const Zmmi& idx, const Zmmi& a) {
  const Lanes<uint64_t> i = lanes_as<uint64_t>(idx), v = lanes_as<uint64_t>(a);
  Lanes<uint64_t> out;
  for (int j = 0; j < 8; ++j) out.v[j] = v.v[i.v[j] & 7];
  return from_lanes<Zmmi>(out);
}

inline Zmm _mm512_permutexvar_ps(const Zmmi& idx, const Zmm& a) {
  Zmm z;
  for (int j = 0; j < 16; ++j) z.f[j] = a.f[idx.d[j] & 15];
  return z;
}

// Words of a at idx's words; a lane whose bit in k is clear is zero.
inline Zmmi _mm512_maskz_permutexvar_epi16(__mmask32 k, const Zmmi& idx, const Zmmi& a) {
  const Lanes<uint16_t> i = lanes_as<uint16_t>(idx), v = lanes_as<uint16_t>(a);
  Lanes<uint16_t> out;
  for (int j = 0; j < 32; ++j) out.v[j] = (k >> j) & 1 ? v.v[i.v[j] & 31] : 0;
  return from_lanes<Zmmi>(out);
}

// Within each 128-bit lane: words 0-3 (lo) or 4-7 (hi) of a and b, interleaved, a's first.
inline Zmmi unpack_epi16(const Zmmi& a, const Zmmi& b, int first) {
  const Lanes<uint16_t> x = lanes_as<uint16_t>(a), y = lanes_as<uint16_t>(b);
  Lanes<uint16_t> out;
  for (int lane = 0; lane < 4; ++lane) {
    for (int j = 0; j < 4; ++j) {
      out.v[8 * lane + 2 * j] = x.v[8 * lane + first + j];
      out.v[8 * lane + 2 * j + 1] = y.v[8 * lane + first + j];
    }
  }
  return from_lanes<Zmmi>(out);
}
inline Zmmi _mm512_unpacklo_epi16(const Zmmi& a, const Zmmi& b) { return unpack_epi16(a, b, 0); }
inline Zmmi _mm512_unpackhi_epi16(const Zmmi& a, const Zmmi& b) { return unpack_epi16(a, b, 4); }

// Within each 128-bit lane: a's 4 signed dwords then b's, saturated to unsigned words.
inline Zmmi _mm512_packus_epi32(const Zmmi& a, const Zmmi& b) {
  const Lanes<int32_t> x = lanes_as<int32_t>(a), y = lanes_as<int32_t>(b);
  auto sat = [](int32_t v) { return static_cast<uint16_t>(v < 0 ? 0 : v > 0xffff ? 0xffff : v); };
  Lanes<uint16_t> out;
  for (int lane = 0; lane < 4; ++lane) {
    for (int j = 0; j < 4; ++j) {
      out.v[8 * lane + j] = sat(x.v[4 * lane + j]);
      out.v[8 * lane + 4 + j] = sat(y.v[4 * lane + j]);
    }
  }
  return from_lanes<Zmmi>(out);
}

// ---- AVX512-BF16 ------------------------------------------------------------------------------
// One fp32 value to bf16 as vcvtne2ps2bf16 does: a NaN keeps its sign and upper payload, quieted;
// zero and denormal inputs give a zero of their sign; an infinity stays one; a normal value is
// rounded to nearest even on its bits.
inline uint16_t cvtne_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t exp = (u >> 23) & 0xff, frac = u & 0x7fffff;
  if (exp == 0) return static_cast<uint16_t>((u >> 16) & 0x8000);
  if (exp == 0xff) return static_cast<uint16_t>((u >> 16) | (frac ? 0x40 : 0));
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// bf16 of b in words 0-15, of a in words 16-31.
inline Zmmbh _mm512_cvtne2ps_pbh(const Zmm& a, const Zmm& b) {
  Zmmbh z;
  for (int i = 0; i < 16; ++i) {
    z.w[i] = cvtne_bf16(b.f[i]);
    z.w[16 + i] = cvtne_bf16(a.f[i]);
  }
  return z;
}

// A bf16 vector's bits as integer lanes (a reinterpret_cast on the native types).
inline Zmmi zmm_bits(const Zmmbh& v) { return from_lanes<Zmmi>(lanes_as<uint16_t>(v)); }

}  // namespace mhc_sp::cpu::MHC_SP_CPU_ISA::zmm_emulated
