// CPU kernels for the mHC math (DESIGN §1): bf16 in/out, fp32 math, at::vec inner loops,
// at::parallel_for over tokens. Compiled once per CPU_CAPABILITY (see CMakeLists.txt).

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "mhc_sp/kernels.h"
#include "mhc_sp/coefficients.h"
#include "mhc_sp/dispatch.h"

namespace mhc_sp::cpu {
namespace CPU_CAPABILITY {

extern const KernelTable table;

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kV = Vec::size();
constexpr int64_t kV2 = 2 * kV;       // one Vectorized<BFloat16> worth of elements
constexpr int kTokenBlock = 16;       // tokens whose projection shares each fn chunk
constexpr int64_t kChunk = 512;       // hidden elements per projection chunk (its fn rows stay in L1/L2)
constexpr int kMaxRows = kMaxHcMult * (kMaxHcMult + 2);
constexpr int64_t kPostSpan = 2048;   // hidden elements per mhc_post work item
constexpr int64_t kSplitHiddenTokens = 4;  // up to this many tokens, threads split the hidden dim
constexpr int64_t kSplitSpan = 1024;       // in spans of this many elements

// bf16 I/O for elementwise loops: 16 values as two fp32 vectors, in an order that only the
// matching store16 undoes (fp32 operands are loaded in the same order by load16). On AVX2 the
// order is the lanes' own ([0-3, 8-11] and [4-7, 12-15]), so neither the widening (one unpack)
// nor the narrowing (one packus) needs a cross-lane permute. Rounding is round-to-nearest-even,
// as c10::BFloat16.
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

// Rounds to bf16, stores, returns the rounded values.
template <bool kAnyNaN = true>
inline void store16(BFloat16* p, Vec& a, Vec& b) {
  const __m256i lo = bf16_bits<kAnyNaN>(a), hi = bf16_bits<kAnyNaN>(b);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_packus_epi32(lo, hi));
  a = Vec(_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)));
  b = Vec(_mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
}
#else
inline void load16(const BFloat16* p, Vec& a, Vec& b) { at::vec::load_to_float(p, a, b); }

inline void load16(const float* p, Vec& a, Vec& b) {
  a = Vec::loadu(p);
  b = Vec::loadu(p + kV);
}

template <bool kAnyNaN = true>
inline void store16(BFloat16* p, Vec& a, Vec& b) {
  const auto packed = at::vec::convert_float_bfloat16(a, b);
  packed.store(p);
  std::tie(a, b) = at::vec::convert_bfloat16_float(packed);
}
#endif

// A NaN coefficient with an arbitrary payload becomes the default NaN, which store16<false> rounds
// correctly (see bf16_bits).
inline Vec broadcast_coefficient(float v) {
  return Vec(std::isnan(v) ? std::numeric_limits<float>::quiet_NaN() : v);
}

inline float hsum(const Vec& v) {
  float lanes[kV];
  v.store(lanes);
  float s = 0.f;
  for (int64_t i = 0; i < kV; ++i) s += lanes[i];
  return s;
}

inline float round_bf16(float v, BFloat16* dst) {
  *dst = BFloat16(v);
  return static_cast<float>(*dst);
}

// mhc_post for one token over hidden range [h0, h1). With kSquares, also returns the sum of
// squares of the bf16-rounded outputs (what the following pre normalises by in mhc_post_pre).
template <int N, bool kSquares>
float post_span(const BFloat16* x, const BFloat16* res, int64_t H, const float* post,
                const float* comb, BFloat16* out, int64_t h0, int64_t h1) {
  // Every NaN here comes from a bf16 input or a canonical coefficient: store16 skips the NaN select.
  Vec pv[N], cv[N][N];
  for (int j = 0; j < N; ++j) pv[j] = broadcast_coefficient(post[j]);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < N; ++j) cv[i][j] = broadcast_coefficient(comb[i * N + j]);
  Vec sq(0.f);
  int64_t h = h0;
  for (; h + kV2 <= h1; h += kV2) {
    Vec xa, xb, ra[N], rb[N];
    load16(x + h, xa, xb);
    for (int i = 0; i < N; ++i) load16(res + i * H + h, ra[i], rb[i]);
    for (int j = 0; j < N; ++j) {
      Vec oa = pv[j] * xa, ob = pv[j] * xb;
      for (int i = 0; i < N; ++i) {
        oa = at::vec::fmadd(cv[i][j], ra[i], oa);
        ob = at::vec::fmadd(cv[i][j], rb[i], ob);
      }
      store16<false>(out + j * H + h, oa, ob);
      if constexpr (kSquares) sq = at::vec::fmadd(oa, oa, at::vec::fmadd(ob, ob, sq));
    }
  }
  float sq_tail = 0.f;
  for (; h < h1; ++h) {
    const float xv = static_cast<float>(x[h]);
    for (int j = 0; j < N; ++j) {
      float o = post[j] * xv;
      for (int i = 0; i < N; ++i) o += comb[i * N + j] * static_cast<float>(res[i * H + h]);
      const float r = round_bf16(o, out + j * H + h);
      sq_tail += r * r;
    }
  }
  return kSquares ? hsum(sq) + sq_tail : 0.f;
}

// Row t of x over [h0, h1): p.x's own, or the rank-order fp32 sum of p.x_parts rounded once to
// bf16 (see PostParams), made in a per-thread row that stays in cache.
const BFloat16* post_x(const PostParams& p, int64_t t, int64_t h0, int64_t h1) {
  if (p.x_parts_count == 0) return p.x + t * p.H;
  thread_local std::vector<BFloat16> row;
  if (static_cast<int64_t>(row.size()) < p.H) row.resize(p.H);
  const int64_t off = t * p.H;
  int64_t h = h0;
  for (; h + kV2 <= h1; h += kV2) {
    Vec a, b;
    load16(p.x_parts[0] + off + h, a, b);
    for (int64_t r = 1; r < p.x_parts_count; ++r) {
      Vec c, d;
      load16(p.x_parts[r] + off + h, c, d);
      a = a + c;
      b = b + d;
    }
    store16(row.data() + h, a, b);
  }
  for (; h < h1; ++h) {
    float v = static_cast<float>(p.x_parts[0][off + h]);
    for (int64_t r = 1; r < p.x_parts_count; ++r) v += static_cast<float>(p.x_parts[r][off + h]);
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
        post_span<N, false>(post_x(p, t, h0, h1), p.residual + t * N * p.H, p.H, p.post + t * N,
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

// acc[r][m] += X[r][:kc] . f[m][:kc] for a TR x MR tile. X rows are bf16, widened in registers,
// so the stream is never staged as fp32; f rows are fstride apart.
template <int TR, int MR>
inline void dot_tile(const BFloat16* const* xs, const float* f, int64_t fstride, int64_t kc,
                     Vec* acc) {
  Vec a[TR][MR];
  for (int r = 0; r < TR; ++r)
    for (int m = 0; m < MR; ++m) a[r][m] = acc[r * kMaxRows + m];
  int64_t k = 0;
  for (; k + kV <= kc; k += kV) {
    Vec xv[TR];
    for (int r = 0; r < TR; ++r) xv[r] = widen8(xs[r] + k);
    for (int m = 0; m < MR; ++m) {
      const Vec fv = load_once(f + m * fstride + k);
      for (int r = 0; r < TR; ++r) a[r][m] = at::vec::fmadd(xv[r], fv, a[r][m]);
    }
  }
  if (k < kc) {
    const int rest = static_cast<int>(kc - k);
    Vec xv[TR];
    for (int r = 0; r < TR; ++r) xv[r] = widen_partial(xs[r] + k, rest);
    for (int m = 0; m < MR; ++m) {
      const Vec fv = Vec::loadu(f + m * fstride + k, rest);
      for (int r = 0; r < TR; ++r) a[r][m] = at::vec::fmadd(xv[r], fv, a[r][m]);
    }
  }
  for (int r = 0; r < TR; ++r)
    for (int m = 0; m < MR; ++m) acc[r * kMaxRows + m] = a[r][m];
}

// mix[r][m] = X[r, :] . fn[m, :] for a block of tokens, fed one chunk of X at a time. The token
// block amortises each fn chunk over many tokens (fn is read once per block, from L2/L3).
struct Projection {
  const float* fn;
  int64_t rows, fstride;
  int tokens;
  Vec acc[kTokenBlock * kMaxRows];

  Projection(const float* fn_, int64_t rows_, int64_t fstride_, int tokens_)
      : fn(fn_), rows(rows_), fstride(fstride_), tokens(tokens_) {
    for (int i = 0; i < tokens * kMaxRows; ++i) acc[i] = Vec(0.f);
  }

  // xs[r]: token r's bf16 values X[r, k0 : k0 + kc].
  void add(const BFloat16* const* xs, int64_t k0, int64_t kc) {
    const float* f = fn + k0;
    int64_t m = 0;
    for (; m + 6 <= rows; m += 6) tile<6>(xs, f + m * fstride, kc, m);
    for (; m + 2 <= rows; m += 2) tile<2>(xs, f + m * fstride, kc, m);
    for (; m < rows; ++m) tile<1>(xs, f + m * fstride, kc, m);
  }

  // 2 tokens x 6 rows = 12 independent accumulators: enough to hide FMA latency on two ports
  // while staying within 16 vector registers.
  template <int MR>
  void tile(const BFloat16* const* xs, const float* f, int64_t kc, int64_t m) {
    int r = 0;
    for (; r + 2 <= tokens; r += 2) dot_tile<2, MR>(xs + r, f, fstride, kc, acc + r * kMaxRows + m);
    for (; r < tokens; ++r) dot_tile<1, MR>(xs + r, f, fstride, kc, acc + r * kMaxRows + m);
  }

  float mix(int r, int64_t m) const { return hsum(acc[r * kMaxRows + m]); }
};

// sum of squares of a bf16 row.
float row_squares(const BFloat16* row, int64_t len) {
  Vec sq(0.f);
  int64_t h = 0;
  for (; h + kV2 <= len; h += kV2) {
    Vec a, b;
    load16(row + h, a, b);
    sq = at::vec::fmadd(a, a, at::vec::fmadd(b, b, sq));
  }
  float tail = 0.f;
  for (; h < len; ++h) tail += static_cast<float>(row[h]) * static_cast<float>(row[h]);
  return hsum(sq) + tail;
}

// out = bf16(sum_i pre[i] * stream_i), then optionally the fused RMSNorm on float(out).
void collapse(const BFloat16* const* streams, const float* pre, int64_t n, int64_t H,
              const float* norm_weight, float norm_eps, BFloat16* out) {
  Vec pv[kMaxHcMult];
  for (int64_t i = 0; i < n; ++i) pv[i] = Vec(pre[i]);
  Vec sq(0.f);
  int64_t h = 0;
  for (; h + kV2 <= H; h += kV2) {
    Vec ya(0.f), yb(0.f);
    for (int64_t i = 0; i < n; ++i) {
      Vec a, b;
      load16(streams[i] + h, a, b);
      ya = at::vec::fmadd(pv[i], a, ya);
      yb = at::vec::fmadd(pv[i], b, yb);
    }
    store16(out + h, ya, yb);
    sq = at::vec::fmadd(ya, ya, at::vec::fmadd(yb, yb, sq));
  }
  float sq_tail = 0.f;
  for (; h < H; ++h) {
    float y = 0.f;
    for (int64_t i = 0; i < n; ++i) y += pre[i] * static_cast<float>(streams[i][h]);
    const float r = round_bf16(y, out + h);
    sq_tail += r * r;
  }
  if (!norm_weight) return;
  const float total = hsum(sq) + sq_tail;
  const float inv = 1.0f / std::sqrt(total / static_cast<float>(H) + norm_eps);
  const Vec iv(inv);
  for (h = 0; h + kV2 <= H; h += kV2) {
    Vec a, b, wa, wb;
    load16(out + h, a, b);
    load16(norm_weight + h, wa, wb);
    a = a * iv * wa;
    b = b * iv * wb;
    store16(out + h, a, b);
  }
  for (; h < H; ++h) round_bf16(static_cast<float>(out[h]) * inv * norm_weight[h], out + h);
}

// Token t's coefficients from its projected mix and sum of squares (over `count` values), then
// the collapse of its n rows `stream_row(t, i)` into p.out.
template <typename StreamRow>
void finish_token(const PreParams& p, int64_t t, const float* mix, float squares, float count,
                  StreamRow&& stream_row) {
  float pre[kMaxHcMult];
  const float inv_rms = 1.0f / std::sqrt(squares / count + p.s.rms_eps);
  if (p.post) {
    mhc_coefficients(mix, inv_rms, p.scale, p.base, static_cast<int>(p.n), p.s, pre,
                     p.post + t * p.n, p.comb + t * p.n * p.n);
  } else {
    pre_weights(mix, inv_rms, p.scale[0], p.base, static_cast<int>(p.n), p.s.hc_pre_eps, pre);
  }
  const BFloat16* streams[kMaxHcMult];
  for (int64_t i = 0; i < p.n; ++i) streams[i] = stream_row(t, i);
  collapse(streams, pre, p.n, p.H, p.norm_weight, p.s.norm_eps, p.out + t * p.H);
}

// The pre of tokens [t0, t0 + tb) whose projected rows are ready in bf16 memory (and, having just
// been read or written sequentially by the caller, in cache): the projection over `proj_streams`
// rows of width H per token (`proj_row(t, i)`), then finish_token. `squares[r]` is token r's sum
// of squares over its projected rows.
template <typename ProjRow, typename StreamRow>
void pre_block(const PreParams& p, int64_t t0, int tb, int64_t proj_streams, const float* squares,
               ProjRow&& proj_row, StreamRow&& stream_row) {
  Projection proj(p.fn, p.rows, proj_streams * p.H, tb);
  const BFloat16* xs[kTokenBlock];
  for (int64_t i = 0; i < proj_streams; ++i) {
    for (int64_t h0 = 0; h0 < p.H; h0 += kChunk) {
      for (int r = 0; r < tb; ++r) xs[r] = proj_row(t0 + r, i) + h0;
      proj.add(xs, i * p.H + h0, std::min(kChunk, p.H - h0));
    }
  }
  for (int r = 0; r < tb; ++r) {
    float mix[kMaxRows];
    for (int64_t m = 0; m < p.rows; ++m) mix[m] = proj.mix(r, m);
    finish_token(p, t0 + r, mix, squares[r], static_cast<float>(proj_streams * p.H), stream_row);
  }
}

// Decode-size calls have too few tokens to give every thread a block, so the hidden dimension is
// split instead: work item c makes hidden span c of every token ready (`produce`) and projects it
// into partial sums, which are then added in span order. Neither the spans nor that order depend
// on the thread count, and so neither does the result.
template <typename Produce, typename ProjRow, typename StreamRow>
void pre_split_hidden(const PreParams& p, int64_t proj_streams, Produce&& produce,
                      ProjRow&& proj_row, StreamRow&& stream_row) {
  const int tb = static_cast<int>(p.T);
  const int64_t spans = (p.H + kSplitSpan - 1) / kSplitSpan;
  const int64_t stride = tb * (kMaxRows + 1);  // per span: each token's mix, then its squares
  std::vector<float> partial(spans * stride);
  at::parallel_for(0, spans, 1, [&](int64_t begin, int64_t end) {
    const BFloat16* xs[kTokenBlock];
    for (int64_t c = begin; c < end; ++c) {
      const int64_t h0 = c * kSplitSpan, h1 = std::min(p.H, h0 + kSplitSpan);
      float* out = partial.data() + c * stride;
      for (int r = 0; r < tb; ++r) out[tb * kMaxRows + r] = produce(r, h0, h1);
      Projection proj(p.fn, p.rows, proj_streams * p.H, tb);
      for (int64_t i = 0; i < proj_streams; ++i) {  // fn read forward, row by row, as in pre_block
        for (int64_t k0 = h0; k0 < h1; k0 += kChunk) {
          for (int r = 0; r < tb; ++r) xs[r] = proj_row(r, i) + k0;
          proj.add(xs, i * p.H + k0, std::min(kChunk, h1 - k0));
        }
      }
      for (int r = 0; r < tb; ++r)
        for (int64_t m = 0; m < p.rows; ++m) out[r * kMaxRows + m] = proj.mix(r, m);
    }
  });
  for (int r = 0; r < tb; ++r) {
    float mix[kMaxRows] = {}, squares = 0.f;
    for (int64_t c = 0; c < spans; ++c) {
      const float* part = partial.data() + c * stride;
      for (int64_t m = 0; m < p.rows; ++m) mix[m] += part[r * kMaxRows + m];
      squares += part[tb * kMaxRows + r];
    }
    finish_token(p, r, mix, squares, static_cast<float>(proj_streams * p.H), stream_row);
  }
}

// The pre of every token: `produce(t, h0, h1)` makes token t's projected rows ready over hidden
// range [h0, h1) and returns their sum of squares. Blocks of tokens run in parallel; below
// kSplitHiddenTokens tokens the hidden dimension is split instead.
template <typename Produce, typename ProjRow, typename StreamRow>
void pre_tokens(const PreParams& p, int64_t proj_streams, Produce&& produce, ProjRow&& proj_row,
                StreamRow&& stream_row) {
  if (p.T <= kSplitHiddenTokens) {
    pre_split_hidden(p, proj_streams, produce, proj_row, stream_row);
    return;
  }
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t tb = std::clamp<int64_t>((p.T + threads - 1) / threads, 1, kTokenBlock);
  const int64_t blocks = (p.T + tb - 1) / tb;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t t0 = b * tb;
      const int n = static_cast<int>(std::min<int64_t>(tb, p.T - t0));
      float squares[kTokenBlock];
      for (int r = 0; r < n; ++r) squares[r] = produce(t0 + r, 0, p.H);
      pre_block(p, t0, n, proj_streams, squares, proj_row, stream_row);
    }
  });
}

// mhc_pre and hc_head: project and collapse the input stream itself.
void pre_from_stream(const BFloat16* residual, const PreParams& p) {
  auto row = [&](int64_t t, int64_t i) { return residual + (t * p.n + i) * p.H; };
  auto squares = [&](int64_t t, int64_t h0, int64_t h1) {
    float sum = 0.f;
    for (int64_t i = 0; i < p.n; ++i) sum += row_squares(row(t, i) + h0, h1 - h0);
    return sum;
  };
  pre_tokens(p, p.n, squares, row, row);
}

void mhc_post_pre(const PostParams& q, const PreParams& p) {
  dispatch_hc_mult(p.n, [&](auto n_const) {
    constexpr int N = decltype(n_const)::value;
    auto out_row = [&](int64_t t, int64_t i) { return q.residual_out + (t * N + i) * p.H; };
    auto post = [&](int64_t t, int64_t h0, int64_t h1) {
      return post_span<N, true>(post_x(q, t, h0, h1), q.residual + t * N * p.H, p.H, q.post + t * N,
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
    return row_squares(x_row(t, 0) + h0, h1 - h0);
  };
  pre_tokens(p, 1, broadcast, x_row, x_row);
}

const KernelTable table{
    "cpu-" C10_STRINGIZE(CPU_CAPABILITY), mhc_post, pre_from_stream, mhc_post_pre, mhc_pre_broadcast,
    pre_from_stream,
};

}  // namespace CPU_CAPABILITY
}  // namespace mhc_sp::cpu
