// SPDX-License-Identifier: Apache-2.0
#pragma once
// NVTX ranges in the "mhc_sp" domain (header-only NVTX3; a no-op unless a profiler such as nsys is
// attached). Without the CUDA toolkit headers the ranges compile to nothing.
//
// MHC_SP_NVTX_RANGE("op") opens `mhc_sp::op` for a whole op, once: when an op runs another op
// (fused_layer's composed path calls mhc_post_pre), only the outermost opens a range, so every
// range is one op call and none is counted twice. MHC_SP_NVTX_PHASE("op/phase") opens a child
// range `mhc_sp::op/phase` for a phase of the op (e.g. fused_layer/exchange, fused_layer/gather).

namespace mhc_sp {
// mhc_sp op ranges open on this thread.
inline thread_local int nvtx_op_depth = 0;
}  // namespace mhc_sp

#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>

namespace mhc_sp {

struct NvtxDomainTag {
  static constexpr const char* name{"mhc_sp"};
};

inline nvtxDomainHandle_t nvtx_domain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA(NvtxDomainTag::name);
  return domain;
}

inline void nvtx_push(const char* message) {
  nvtxEventAttributes_t attr{};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attr.message.ascii = message;
  nvtxDomainRangePushEx(nvtx_domain(), &attr);
}

inline void nvtx_pop() { nvtxDomainRangePop(nvtx_domain()); }

}  // namespace mhc_sp
#else
namespace mhc_sp {
inline void nvtx_push(const char*) {}
inline void nvtx_pop() {}
}  // namespace mhc_sp
#endif

namespace mhc_sp {

class NvtxOpRange {
 public:
  explicit NvtxOpRange(const char* message) : open_(nvtx_op_depth++ == 0) {
    if (open_) nvtx_push(message);
  }
  ~NvtxOpRange() {
    --nvtx_op_depth;
    if (open_) nvtx_pop();
  }
  NvtxOpRange(const NvtxOpRange&) = delete;
  NvtxOpRange& operator=(const NvtxOpRange&) = delete;

 private:
  bool open_;
};

class NvtxPhaseRange {
 public:
  explicit NvtxPhaseRange(const char* message) { nvtx_push(message); }
  ~NvtxPhaseRange() { nvtx_pop(); }
  NvtxPhaseRange(const NvtxPhaseRange&) = delete;
  NvtxPhaseRange& operator=(const NvtxPhaseRange&) = delete;
};

}  // namespace mhc_sp

#define MHC_SP_NVTX_RANGE(op) ::mhc_sp::NvtxOpRange mhc_sp_nvtx_range_("mhc_sp::" op)
#define MHC_SP_NVTX_PHASE(phase) ::mhc_sp::NvtxPhaseRange mhc_sp_nvtx_phase_("mhc_sp::" phase)
