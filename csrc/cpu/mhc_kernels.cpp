// CPU kernels for the mHC math (DESIGN §1): bf16 in/out, fp32 math, at::vec inner loops,
// at::parallel_for over tokens. Compiled once per CPU_CAPABILITY (see CMakeLists.txt).

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "mhc_sp/kernels.h"
#include "mhc_sp/coefficients.h"

namespace mhc_sp::cpu {
namespace CPU_CAPABILITY {

extern const KernelTable table;

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kV = Vec::size();
constexpr int64_t kV2 = 2 * kV;       // one Vectorized<BFloat16> worth of elements
constexpr int kTokenBlock = 4;        // tokens whose projection shares each fn chunk
constexpr int64_t kChunk = 256;       // hidden elements per projection chunk (L1-resident scratch)
constexpr int kMaxRows = kMaxHcMult * (kMaxHcMult + 2);
constexpr int64_t kPostSpan = 2048;   // hidden elements per mhc_post work item

inline void load2(const BFloat16* p, Vec& a, Vec& b) { at::vec::load_to_float(p, a, b); }

// Rounds to bf16 (round-to-nearest-even, as torch's .to(bfloat16)), stores, returns the rounded values.
inline void store2(BFloat16* p, Vec& a, Vec& b) {
  const auto packed = at::vec::convert_float_bfloat16(a, b);
  packed.store(p);
  std::tie(a, b) = at::vec::convert_bfloat16_float(packed);
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

template <typename F>
void dispatch_hc_mult(int64_t n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
  }
  TORCH_CHECK(false, "hc_mult ", n, " is outside [1, ", kMaxHcMult, "]");
}

// mhc_post for one token over hidden range [h0, h1). When `scratch` is set, the bf16-rounded
// outputs are also written there as fp32 (stream j at scratch + j * scratch_stride), which is
// what the following pre projects in mhc_post_pre.
template <int N>
void post_span(const BFloat16* x, const BFloat16* res, int64_t H, const float* post,
               const float* comb, BFloat16* out, int64_t h0, int64_t h1, float* scratch,
               int64_t scratch_stride) {
  Vec pv[N], cv[N][N];
  for (int j = 0; j < N; ++j) pv[j] = Vec(post[j]);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < N; ++j) cv[i][j] = Vec(comb[i * N + j]);
  int64_t h = h0;
  for (; h + kV2 <= h1; h += kV2) {
    Vec xa, xb, ra[N], rb[N];
    load2(x + h, xa, xb);
    for (int i = 0; i < N; ++i) load2(res + i * H + h, ra[i], rb[i]);
    for (int j = 0; j < N; ++j) {
      Vec oa = pv[j] * xa, ob = pv[j] * xb;
      for (int i = 0; i < N; ++i) {
        oa = at::vec::fmadd(cv[i][j], ra[i], oa);
        ob = at::vec::fmadd(cv[i][j], rb[i], ob);
      }
      store2(out + j * H + h, oa, ob);
      if (scratch) {
        oa.store(scratch + j * scratch_stride + (h - h0));
        ob.store(scratch + j * scratch_stride + (h - h0) + kV);
      }
    }
  }
  for (; h < h1; ++h) {
    const float xv = static_cast<float>(x[h]);
    for (int j = 0; j < N; ++j) {
      float o = post[j] * xv;
      for (int i = 0; i < N; ++i) o += comb[i * N + j] * static_cast<float>(res[i * H + h]);
      const float r = round_bf16(o, out + j * H + h);
      if (scratch) scratch[j * scratch_stride + (h - h0)] = r;
    }
  }
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
        post_span<N>(p.x + t * p.H, p.residual + t * N * p.H, p.H, p.post + t * N,
                     p.comb + t * N * N, p.residual_out + t * N * p.H, h0,
                     std::min(p.H, h0 + kPostSpan), nullptr, 0);
      }
    });
  });
}

// acc[r][m] += xs[r][:kc] * f[m][:kc] for a TR x MR tile; xs rows are kChunk apart, f rows fstride.
template <int TR, int MR>
inline void dot_tile(const float* xs, const float* f, int64_t fstride, int64_t kc, Vec* acc) {
  Vec a[TR][MR];
  for (int r = 0; r < TR; ++r)
    for (int m = 0; m < MR; ++m) a[r][m] = acc[r * kMaxRows + m];
  int64_t k = 0;
  for (; k + kV <= kc; k += kV) {
    Vec xv[TR];
    for (int r = 0; r < TR; ++r) xv[r] = Vec::loadu(xs + r * kChunk + k);
    for (int m = 0; m < MR; ++m) {
      const Vec fv = Vec::loadu(f + m * fstride + k);
      for (int r = 0; r < TR; ++r) a[r][m] = at::vec::fmadd(xv[r], fv, a[r][m]);
    }
  }
  if (k < kc) {
    const int rest = static_cast<int>(kc - k);
    Vec xv[TR];
    for (int r = 0; r < TR; ++r) xv[r] = Vec::loadu(xs + r * kChunk + k, rest);
    for (int m = 0; m < MR; ++m) {
      const Vec fv = Vec::loadu(f + m * fstride + k, rest);
      for (int r = 0; r < TR; ++r) a[r][m] = at::vec::fmadd(xv[r], fv, a[r][m]);
    }
  }
  for (int r = 0; r < TR; ++r)
    for (int m = 0; m < MR; ++m) acc[r * kMaxRows + m] = a[r][m];
}

// mix[t][m] = sum_k X[t,k] fn[m,k] and sum_k X[t,k]^2 for a block of tokens, fed chunk by chunk.
struct Projection {
  const float* fn;
  int64_t rows, fstride;
  int tokens;
  Vec acc[kTokenBlock * kMaxRows];
  Vec sumsq[kTokenBlock];

  Projection(const float* fn_, int64_t rows_, int64_t fstride_, int tokens_)
      : fn(fn_), rows(rows_), fstride(fstride_), tokens(tokens_) {
    for (auto& v : acc) v = Vec(0.f);
    for (auto& v : sumsq) v = Vec(0.f);
  }

  // xs: `tokens` rows of kc fp32 values, kChunk apart, holding X[:, k0:k0+kc].
  void add(const float* xs, int64_t k0, int64_t kc) {
    for (int r = 0; r < tokens; ++r) {
      int64_t k = 0;
      for (; k + kV <= kc; k += kV) {
        const Vec v = Vec::loadu(xs + r * kChunk + k);
        sumsq[r] = at::vec::fmadd(v, v, sumsq[r]);
      }
      if (k < kc) {
        const Vec v = Vec::loadu(xs + r * kChunk + k, static_cast<int>(kc - k));
        sumsq[r] = at::vec::fmadd(v, v, sumsq[r]);
      }
    }
    const float* f = fn + k0;
    int64_t m = 0;
    for (; m + 4 <= rows; m += 4) tile<4>(xs, f + m * fstride, kc, m);
    for (; m < rows; ++m) tile<1>(xs, f + m * fstride, kc, m);
  }

  template <int MR>
  void tile(const float* xs, const float* f, int64_t kc, int64_t m) {
    int r = 0;
    for (; r + 2 <= tokens; r += 2)
      dot_tile<2, MR>(xs + r * kChunk, f, fstride, kc, acc + r * kMaxRows + m);
    for (; r < tokens; ++r) dot_tile<1, MR>(xs + r * kChunk, f, fstride, kc, acc + r * kMaxRows + m);
  }

  float mix(int r, int64_t m) const { return hsum(acc[r * kMaxRows + m]); }
  float squares(int r) const { return hsum(sumsq[r]); }
};

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
      load2(streams[i] + h, a, b);
      ya = at::vec::fmadd(pv[i], a, ya);
      yb = at::vec::fmadd(pv[i], b, yb);
    }
    store2(out + h, ya, yb);
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
    Vec a, b;
    load2(out + h, a, b);
    a = a * iv * Vec::loadu(norm_weight + h);
    b = b * iv * Vec::loadu(norm_weight + h + kV);
    store2(out + h, a, b);
  }
  for (; h < H; ++h) round_bf16(static_cast<float>(out[h]) * inv * norm_weight[h], out + h);
}

// The pre pipeline over tokens [t0, t0 + tb): projection of `proj_streams` streams of width H
// (filled chunk-wise into fp32 scratch by `fill(h0, hc, scratch)`), coefficients, collapse.
// `stream_row(t, i)` is the bf16 row collapsed for token t, stream i.
template <typename Fill, typename StreamRow>
void pre_block(const PreParams& p, int64_t t0, int tb, int64_t proj_streams, Fill&& fill,
               StreamRow&& stream_row) {
  float scratch[kMaxHcMult * kTokenBlock * kChunk];
  Projection proj(p.fn, p.rows, proj_streams * p.H, tb);
  for (int64_t h0 = 0; h0 < p.H; h0 += kChunk) {
    const int64_t hc = std::min(kChunk, p.H - h0);
    fill(h0, hc, scratch);
    for (int64_t i = 0; i < proj_streams; ++i)
      proj.add(scratch + i * kTokenBlock * kChunk, i * p.H + h0, hc);
  }
  const float count = static_cast<float>(proj_streams * p.H);
  for (int r = 0; r < tb; ++r) {
    const int64_t t = t0 + r;
    float mix[kMaxRows], pre[kMaxHcMult];
    for (int64_t m = 0; m < p.rows; ++m) mix[m] = proj.mix(r, m);
    const float inv_rms = 1.0f / std::sqrt(proj.squares(r) / count + p.s.rms_eps);
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
}

// Runs `block(t0, tb)` over token blocks in parallel.
template <typename Block>
void for_token_blocks(int64_t T, Block&& block) {
  const int64_t blocks = (T + kTokenBlock - 1) / kTokenBlock;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t t0 = b * kTokenBlock;
      block(t0, static_cast<int>(std::min<int64_t>(kTokenBlock, T - t0)));
    }
  });
}

// scratch[i][r][:hc] = float(rows(t0 + r, i)[h0 : h0 + hc])
template <typename Row>
void fill_from_bf16(int64_t t0, int tb, int64_t streams, int64_t h0, int64_t hc, Row&& row,
                    float* scratch) {
  for (int64_t i = 0; i < streams; ++i) {
    for (int r = 0; r < tb; ++r) {
      const BFloat16* src = row(t0 + r, i) + h0;
      float* dst = scratch + (i * kTokenBlock + r) * kChunk;
      int64_t h = 0;
      for (; h + kV2 <= hc; h += kV2) {
        Vec a, b;
        load2(src + h, a, b);
        a.store(dst + h);
        b.store(dst + h + kV);
      }
      for (; h < hc; ++h) dst[h] = static_cast<float>(src[h]);
    }
  }
}

// mhc_pre and hc_head: project and collapse the input stream itself.
void pre_from_stream(const BFloat16* residual, const PreParams& p) {
  auto row = [&](int64_t t, int64_t i) { return residual + (t * p.n + i) * p.H; };
  for_token_blocks(p.T, [&](int64_t t0, int tb) {
    pre_block(p, t0, tb, p.n,
              [&](int64_t h0, int64_t hc, float* s) { fill_from_bf16(t0, tb, p.n, h0, hc, row, s); },
              row);
  });
}

void mhc_post_pre(const PostParams& q, const PreParams& p) {
  dispatch_hc_mult(p.n, [&](auto n_const) {
    constexpr int N = decltype(n_const)::value;
    auto out_row = [&](int64_t t, int64_t i) { return q.residual_out + (t * N + i) * p.H; };
    for_token_blocks(p.T, [&](int64_t t0, int tb) {
      auto fill = [&](int64_t h0, int64_t hc, float* scratch) {
        for (int r = 0; r < tb; ++r) {
          const int64_t t = t0 + r;
          post_span<N>(q.x + t * p.H, q.residual + t * N * p.H, p.H, q.post + t * N,
                       q.comb + t * N * N, q.residual_out + t * N * p.H, h0, h0 + hc,
                       scratch + r * kChunk, kTokenBlock * kChunk);
        }
      };
      pre_block(p, t0, tb, N, fill, out_row);
    });
  });
}

void mhc_pre_broadcast(const BFloat16* x, BFloat16* residual_out, const PreParams& p) {
  auto x_row = [&](int64_t t, int64_t) { return x + t * p.H; };
  for_token_blocks(p.T, [&](int64_t t0, int tb) {
    for (int r = 0; r < tb; ++r)
      for (int64_t i = 0; i < p.n; ++i)
        std::copy_n(x + (t0 + r) * p.H, p.H, residual_out + ((t0 + r) * p.n + i) * p.H);
    pre_block(p, t0, tb, 1,
              [&](int64_t h0, int64_t hc, float* s) { fill_from_bf16(t0, tb, 1, h0, hc, x_row, s); },
              x_row);
  });
}

const KernelTable table{
    "cpu-" C10_STRINGIZE(CPU_CAPABILITY), mhc_post, pre_from_stream, mhc_post_pre, mhc_pre_broadcast,
    pre_from_stream,
};

}  // namespace CPU_CAPABILITY
}  // namespace mhc_sp::cpu
