// SPDX-License-Identifier: Apache-2.0
#pragma once
// Device helpers shared by the mHC CUDA kernels: raw bf16 packs (16-byte vectors or single
// values), round-to-nearest-even conversion, a block-wide sum and the bf16 tensor-core MMA (the
// pairwise tree that fixes the projection's summation order is in cuda/device/leaf_tree.h).
// bf16 data is handled as raw uint16_t bits: c10::BFloat16 and __nv_bfloat16 are both plain
// 2-byte values, so the launchers reinterpret the pointers.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/device/asm.cuh"
#include "cuda/device/leaf_tree.h"

namespace mhc_sp::cuda {

// The mHC op a pre-style kernel instance computes (see PreParams in mhc_sp/detail/kernels.h).
enum class Mode : int {
  Pre,        // mhc_pre: project + collapse the input stream
  PostPre,    // mhc_post_pre: post writes residual_out, which is projected and collapsed
  Broadcast,  // mhc_pre_broadcast: x copied into n streams, fn pre-summed to (rows, H)
  Head,       // hc_head: rows = n, pre weights only, no norm
};

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits) {
  return __uint_as_float(bits << 16);
}

// Round-to-nearest-even, as torch's .to(torch.bfloat16).
__device__ __forceinline__ uint16_t float_to_bf16_bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// V consecutive bf16 values: V == 8 is one 16-byte vector, V == 1 the scalar fallback.
template <int V>
struct Pack;

template <>
struct Pack<8> {
  uint4 u;
  __device__ __forceinline__ static Pack load(const uint16_t* p) {  // read-only inputs
    return Pack{__ldg(reinterpret_cast<const uint4*>(p))};
  }
  __device__ __forceinline__ static Pack load_l2(const uint16_t* p) {  // written in this kernel
    return Pack{__ldcg(reinterpret_cast<const uint4*>(p))};
  }
  __device__ __forceinline__ void store(uint16_t* p) const { *reinterpret_cast<uint4*>(p) = u; }
  __device__ __forceinline__ void to_float(float (&f)[8]) const {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      f[2 * k] = __uint_as_float(w[k] << 16);
      f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  }
  __device__ __forceinline__ static Pack from_float(const float (&f)[8]) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      w[k] = uint32_t(float_to_bf16_bits(f[2 * k])) |
             (uint32_t(float_to_bf16_bits(f[2 * k + 1])) << 16);
    return Pack{make_uint4(w[0], w[1], w[2], w[3])};
  }
  __device__ __forceinline__ static Pack zero() { return Pack{make_uint4(0, 0, 0, 0)}; }
};

template <>
struct Pack<1> {
  uint16_t u;
  __device__ __forceinline__ static Pack load(const uint16_t* p) { return Pack{__ldg(p)}; }
  __device__ __forceinline__ static Pack load_l2(const uint16_t* p) { return Pack{__ldcg(p)}; }
  __device__ __forceinline__ void store(uint16_t* p) const { *p = u; }
  __device__ __forceinline__ void to_float(float (&f)[1]) const { f[0] = bf16_bits_to_float(u); }
  __device__ __forceinline__ static Pack from_float(const float (&f)[1]) {
    return Pack{float_to_bf16_bits(f[0])};
  }
  __device__ __forceinline__ static Pack zero() { return Pack{0}; }
};

// A thread's walk over items first, first + step, ... of a flattened (rows x per_row) loop: row
// and column advance by addition, so the loop body does no (64-bit) division per item.
struct RowWalk {
  int64_t row;
  int col;
  int per_row, step_rows, step_cols;
  __device__ __forceinline__ RowWalk(uint32_t first, int per_row_, uint32_t step)
      : row(first / uint32_t(per_row_)),
        col(static_cast<int>(first % uint32_t(per_row_))),
        per_row(per_row_),
        step_rows(static_cast<int>(step / uint32_t(per_row_))),
        step_cols(static_cast<int>(step % uint32_t(per_row_))) {}
  __device__ __forceinline__ void next() {
    row += step_rows;
    col += step_cols;
    if (col >= per_row) {
      col -= per_row;
      ++row;
    }
  }
};

// Sum of `v` over the block; every thread gets the result. `scratch` holds >= 32 floats and
// may be reused as soon as this returns (the trailing barrier protects it).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = (blockDim.x + 31) / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += scratch[w];  // fixed order: deterministic
  __syncthreads();
  return total;
}

// D = A (16x16, row-major bf16) * B (16x8, column-major bf16), fp32, from a zero accumulator.
// Fragment layout (PTX ISA, mma.m16n8k16 .bf16), with g = lane / 4 and c = lane % 4:
//   a[0] = A[g][2c..2c+1]   a[1] = A[g+8][2c..2c+1]   a[2] = A[g][2c+8..]   a[3] = A[g+8][2c+8..]
//   b[0] = B[2c..2c+1][g]   b[1] = B[2c+8..2c+9][g]
//   d[0..1] = D[g][2c..2c+1]   d[2..3] = D[g+8][2c..2c+1]
// Each 32-bit register holds two bf16, the lower k (or column) index in the low half. Each output
// is one 16-product dot product of its own row and column: other rows never change it.
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  MHC_SP_ASM(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};\n",
      (MHC_SP_ASM_ARG("=f", d[0]), MHC_SP_ASM_ARG("=f", d[1]), MHC_SP_ASM_ARG("=f", d[2]),
       MHC_SP_ASM_ARG("=f", d[3])),
      (MHC_SP_ASM_ARG("r", a[0]), MHC_SP_ASM_ARG("r", a[1]), MHC_SP_ASM_ARG("r", a[2]),
       MHC_SP_ASM_ARG("r", a[3]), MHC_SP_ASM_ARG("r", b0), MHC_SP_ASM_ARG("r", b1),
       MHC_SP_ASM_ARG("f", 0.f)),
      ());
#else
  __trap();  // this project builds for sm_90a / sm_100a; bf16 mma needs sm_80+
#endif
}

// Two fp32 values as three bf16x2 pairs hi + mid + lo (each RNE of what the previous ones miss):
// together they carry the whole 24-bit significand, so bf16 x (hi + mid + lo) with products exact
// in fp32 is the fp32 product to within ~2^-24 relative (X is bf16 already, exact in the MMA).
__device__ __forceinline__ void split_bf16x3(float v0, float v1, uint32_t& hi, uint32_t& mid,
                                             uint32_t& lo) {
  uint32_t parts[3];
  float r0 = v0, r1 = v1;
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const uint16_t h0 = float_to_bf16_bits(r0), h1 = float_to_bf16_bits(r1);
    parts[k] = uint32_t(h0) | (uint32_t(h1) << 16);
    r0 -= bf16_bits_to_float(h0);
    r1 -= bf16_bits_to_float(h1);
  }
  hi = parts[0];
  mid = parts[1];
  lo = parts[2];
}

}  // namespace mhc_sp::cuda
