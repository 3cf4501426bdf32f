// SPDX-License-Identifier: Apache-2.0
#pragma once
// Every kernel entry point of the mHC math ops, by backend. The ops' bodies (csrc/ops/mhc_ops.cpp)
// and the shm transport call the KernelTable of the tensors' device with parameters built from
// checked arguments (mhc_sp/detail/params.h): raw pointers, no checks.
//   CPU   csrc/cpu/mhc_kernels.cpp, compiled once per instruction set into mhc_sp::cpu::<ISA>
//         (functions named as the table's fields, and that ISA's `table`); csrc/cpu/dispatch.cpp
//         picks the best one the processor supports, or the one MHC_SP_CPU_KERNELS names. Every
//         table gives bitwise the same results.
//   CUDA  csrc/cuda/<op>.cu, the functions declared in mhc_sp::cuda below (current stream).
// Numerics every kernel keeps (docs/design.md §3b): a token's outputs are bitwise independent of
// the number of tokens in the call and of the thread count or grid.

#include <c10/util/BFloat16.h>

#include <cstdint>

#include "mhc_sp/detail/scalars.h"

namespace mhc_sp {

using c10::BFloat16;

// Where a post's x (T, H) comes from: x's own rows, or (CPU kernels only: the shm transport's
// one-pass boundary) the fp32 sum of +0 + parts[0][t,:] + parts[1][t,:] + ... in that order,
// rounded once to bf16, so that a boundary's reduction is fused into the post and the reduced x is
// never materialised (the parts: every rank's partial rows, in rank order). The CUDA kernels take
// rows only; the symm transport's kernels sum the peers' rows in their own x sources.
struct XSource {
  const BFloat16* rows = nullptr;          // (T, H), when x is given
  const BFloat16* const* parts = nullptr;  // part_count pointers to (T, H) rows, when summed
  int64_t part_count = 0;
  static XSource direct(const BFloat16* rows) { return XSource{rows, nullptr, 0}; }
  static XSource rank_order_sum(const BFloat16* const* parts, int64_t count) {
    return XSource{nullptr, parts, count};
  }
  bool summed() const { return part_count > 0; }
};

// mhc_post: residual_out[t,j,:] = post[t,j] * x[t,:] + sum_i comb[t,i,j] * residual[t,i,:]
struct PostParams {
  int64_t T, n, H;
  XSource x;
  const BFloat16* residual;  // (T, n, H)
  const float* post;         // (T, n)
  const float* comb;         // (T, n, n)
  BFloat16* residual_out;    // (T, n, H)
};

// The projection + coefficients + collapse shared by mhc_pre, mhc_post_pre,
// mhc_pre_broadcast (fn pre-summed over streams, (rows, H)) and hc_head (rows = n, post/comb null).
struct PreParams {
  int64_t T, n, H;
  int64_t rows;              // fn rows: n*(n+2), or n for hc_head
  const float* fn;           // (rows, n*H), or (rows, H) for mhc_pre_broadcast
  const float* scale;        // (3,) or (1,) for hc_head
  const float* base;         // (rows,)
  const float* norm_weight;  // (H,) fp32 or nullptr
  MhcScalars s;
  float* post;    // (T, n) or nullptr (hc_head)
  float* comb;    // (T, n, n) or nullptr (hc_head)
  BFloat16* out;  // (T, H): layer_input, or hc_head's hidden
};

struct KernelTable {
  const char* name;  // backend and instruction set / architectures, reported by build_info()
  // mhc_post: residual_out = post * x + comb^T residual.
  void (*mhc_post)(const PostParams&);
  // mhc_pre: post, comb and layer_input of the stream `residual` (T, n, H).
  void (*mhc_pre)(const BFloat16* residual, const PreParams&);
  // mhc_post_pre: the post, then the pre of its output, in one pass.
  void (*mhc_post_pre)(const PostParams&, const PreParams&);
  // mhc_pre_broadcast: x (T, H) copied into n streams (residual_out), then the pre; fn pre-summed.
  void (*mhc_pre_broadcast)(const BFloat16* x, BFloat16* residual_out, const PreParams&);
  // hc_head: the final collapse (PreParams with rows = n, no post/comb, no norm).
  void (*hc_head)(const BFloat16* residual, const PreParams&);
};

const KernelTable& cpu_kernels();

namespace cpu {
namespace DEFAULT {
extern const KernelTable table;
}
// The x86-64 instances, defined only where the build compiles them (MHC_SP_HAVE_CPU_<ISA>).
namespace AVX2 {
extern const KernelTable table;  // AVX2, FMA, F16C
}
namespace AVX512 {
extern const KernelTable table;  // AVX-512 F/BW/VL/DQ
}
namespace AVX512_BF16 {
extern const KernelTable table;  // AVX512 and AVX512-BF16's rounding to bf16
}
// Testing builds: the AVX512 and AVX512_BF16 sources run on an AVX2 CPU (csrc/cpu/zmm_emulated.h).
namespace AVX512_EMULATED {
extern const KernelTable table;
}
namespace AVX512_BF16_EMULATED {
extern const KernelTable table;
}
}  // namespace cpu

#if defined(MHC_SP_WITH_CUDA)
const KernelTable& cuda_kernels();

namespace cuda {
void mhc_post(const PostParams& p);                          // mhc_kernels.cu
void mhc_pre(const BFloat16* residual, const PreParams& p);  // mhc_pre.cu
void mhc_post_pre(const PostParams& q, const PreParams& p);  // mhc_post_pre.cu
void mhc_pre_broadcast(const BFloat16* x, BFloat16* residual_out,
                       const PreParams& p);                  // mhc_pre_broadcast.cu
void hc_head(const BFloat16* residual, const PreParams& p);  // hc_head.cu
}  // namespace cuda
#endif

}  // namespace mhc_sp
