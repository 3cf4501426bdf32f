// SPDX-License-Identifier: Apache-2.0
#pragma once
// mhc_post (docs/design.md §1): out[t,j,h] = post[t,j] * x[t,h] + sum_i comb[t,i,j] *
// residual[t,i,h]. Bandwidth-bound: every element of x and residual is read once (16-byte loads
// when the vector path is allowed) and every output element written once; fp32 math, bf16 (RNE)
// out.

#include "cuda/device/common.cuh"

namespace mhc_sp::cuda {

// The post for V hidden positions of one token, all N output streams. `x` and `res` point at the
// token's rows at position h; output stream j goes to out + j * H. When `xs` is set the rounded
// outputs are also stored there (stream j at xs + j * xs_stride): the staging buffer of the
// projection that follows in mhc_post_pre, which must see exactly the bf16 values written out.
// Arithmetic order matches the CPU kernel: o = post * x, then o = fma(comb[i][j], r_i, o).
// post_values takes x already widened (the symmetric-memory boundary reduces it on the fly).
template <int N, int V>
__device__ __forceinline__ void post_values(const float (&xv)[V], const uint16_t* res, int64_t H,
                                            const float* post, const float* comb, uint16_t* out,
                                            uint16_t* xs, int xs_stride) {
  float rv[N][V];
#pragma unroll
  for (int i = 0; i < N; ++i) Pack<V>::load(res + i * H).to_float(rv[i]);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    float o[V];
#pragma unroll
    for (int e = 0; e < V; ++e) o[e] = post[j] * xv[e];
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
      for (int e = 0; e < V; ++e) o[e] = fmaf(comb[i * N + j], rv[i][e], o[e]);
    }
    const Pack<V> packed = Pack<V>::from_float(o);
    packed.store(out + j * H);
    if (xs != nullptr) packed.store(xs + j * xs_stride);
  }
}

template <int N, int V>
__device__ __forceinline__ void post_vector(const uint16_t* x, const uint16_t* res, int64_t H,
                                            const float* post, const float* comb, uint16_t* out,
                                            uint16_t* xs, int xs_stride) {
  float xv[V];
  Pack<V>::load(x).to_float(xv);
  post_values<N, V>(xv, res, H, post, comb, out, xs, xs_stride);
}

struct PostArgs {
  int64_t T, H;
  const uint16_t* x;         // (T, H)
  const uint16_t* residual;  // (T, N, H)
  const float* post;         // (T, N)
  const float* comb;         // (T, N, N)
  uint16_t* out;             // (T, N, H)
  int64_t spans;             // hidden spans of kPostThreads * V elements per token
};

constexpr int kPostThreads = 256;

// One work item = (token, span of kPostThreads * V hidden positions); blocks stride over items,
// so any T fits the grid. The token's n + n^2 coefficients are staged in shared memory once per
// item instead of being loaded by every thread.
template <int N, int V>
__global__ void __launch_bounds__(kPostThreads) post_kernel(PostArgs a) {
  __shared__ float coef[N + N * N];
#pragma unroll 1
  for (RowWalk w(blockIdx.x, static_cast<int>(a.spans), gridDim.x); w.row < a.T; w.next()) {
    const int64_t t = w.row;
    const int64_t h = int64_t(w.col) * (kPostThreads * V) + int64_t(threadIdx.x) * V;
    __syncthreads();  // the previous item's readers are done with coef
    if (threadIdx.x < N) {
      coef[threadIdx.x] = a.post[t * N + threadIdx.x];
    } else if (threadIdx.x < N + N * N) {
      coef[threadIdx.x] = a.comb[t * N * N + (threadIdx.x - N)];
    }
    __syncthreads();
    if (h < a.H) {
      post_vector<N, V>(a.x + t * a.H + h, a.residual + t * N * a.H + h, a.H, coef, coef + N,
                        a.out + t * N * a.H + h, nullptr, 0);
    }
  }
}

}  // namespace mhc_sp::cuda
