// SPDX-License-Identifier: Apache-2.0
// Picks the CPU kernel table for the running processor (csrc/cpu/mhc_kernels.cpp is compiled
// once per instruction set), so the library never executes an instruction the CPU lacks. Every
// table gives bitwise the same results (docs/design.md §3b); MHC_SP_CPU_KERNELS forces one, for
// tests and comparisons.
#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

#include "mhc_sp/detail/kernels.h"

namespace mhc_sp {
namespace cpu {
namespace {

bool has_avx2() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool has_avx512() {
#if defined(__x86_64__) || defined(_M_X64)
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

bool has_avx512_bf16() {
#if defined(__x86_64__) || defined(_M_X64)
  return has_avx512() && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

bool has_nothing_more() { return true; }

struct Choice {
  const char* name;          // MHC_SP_CPU_KERNELS's value
  const char* needs;         // what the CPU must have, for the refusal
  const KernelTable* table;  // nullptr where this build does not compile it
  bool (*supported)();
  bool forced_only = false;  // never picked unless MHC_SP_CPU_KERNELS names it
};

// Best first.
const Choice kChoices[] = {
#if defined(MHC_SP_HAVE_CPU_AVX512_BF16)
    {"avx512_bf16", "AVX-512 F/BW/VL/DQ and AVX512-BF16", &AVX512_BF16::table, has_avx512_bf16},
#else
    {"avx512_bf16", "AVX-512 F/BW/VL/DQ and AVX512-BF16", nullptr, has_avx512_bf16},
#endif
#if defined(MHC_SP_HAVE_CPU_AVX512)
    {"avx512", "AVX-512 F/BW/VL/DQ", &AVX512::table, has_avx512},
#else
    {"avx512", "AVX-512 F/BW/VL/DQ", nullptr, has_avx512},
#endif
#if defined(MHC_SP_HAVE_CPU_AVX2)
    {"avx2", "AVX2, FMA and F16C", &AVX2::table, has_avx2},
#else
    {"avx2", "AVX2, FMA and F16C", nullptr, has_avx2},
#endif
    {"default", "nothing", &DEFAULT::table, has_nothing_more},
// Testing builds: the AVX-512 tables' source with its zmm intrinsics emulated on AVX2, for the
// cross-table tests on machines without AVX-512 (as fast as nothing; never picked by itself).
#if defined(MHC_SP_HAVE_CPU_AVX512_EMULATED)
    {"avx512_emulated", "AVX2, FMA and F16C", &AVX512_EMULATED::table, has_avx2, true},
    {"avx512_bf16_emulated", "AVX2, FMA and F16C", &AVX512_BF16_EMULATED::table, has_avx2, true},
#endif
};

const KernelTable& select_kernels() {
  const char* forced = std::getenv("MHC_SP_CPU_KERNELS");
  if (forced == nullptr || *forced == '\0') {
    for (const Choice& c : kChoices) {
      if (c.table != nullptr && !c.forced_only && c.supported()) return *c.table;
    }
  }
  for (const Choice& c : kChoices) {
    if (std::string(c.name) != forced) continue;
    TORCH_CHECK(c.table != nullptr, "MHC_SP_CPU_KERNELS=", forced,
                ": this build has no such kernels (they are compiled on x86-64 only)");
    TORCH_CHECK(c.supported(), "MHC_SP_CPU_KERNELS=", forced, ": this CPU lacks ", c.needs);
    return *c.table;
  }
  std::string names;
  for (const Choice& c : kChoices) names += std::string(names.empty() ? "" : ", ") + c.name;
  TORCH_CHECK(false, "MHC_SP_CPU_KERNELS=", forced, " is not one of ", names);
}

}  // namespace
}  // namespace cpu

const KernelTable& cpu_kernels() {
  static const KernelTable& chosen = cpu::select_kernels();
  return chosen;
}

}  // namespace mhc_sp
