// SPDX-License-Identifier: Apache-2.0
// Picks the CPU kernel table for the running processor (csrc/cpu/mhc_kernels.cpp is compiled
// once per instruction set), so the library never executes an instruction the CPU lacks.
#include "mhc_sp/detail/kernels.h"

namespace mhc_sp {
namespace cpu {

static const KernelTable& select_kernels() {
#if defined(MHC_SP_HAVE_CPU_AVX2)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return AVX2::table;
  }
#endif
  return DEFAULT::table;
}
}  // namespace cpu

const KernelTable& cpu_kernels() {
  static const KernelTable& chosen = cpu::select_kernels();
  return chosen;
}

}  // namespace mhc_sp
