// SPDX-License-Identifier: Apache-2.0
#pragma once
// Profiler ranges. NVTX ranges in the "mhc_sp" domain (header-only NVTX v3: a no-op unless a tool
// such as nsys is attached) when the build found the NVTX headers (MHC_SP_WITH_NVTX, set by
// setup.py); phases are also torch.profiler ranges (at::RecordFunction), on every build.
//
// MHC_SP_NVTX_RANGE("op") opens `mhc_sp::op` for a whole op: only the public entries open one, and
// no op calls another's entry (the composed paths and the transports run the bodies of
// mhc_sp/detail/impl.h), so every range is one op call and none is counted twice. torch.profiler
// records the op itself (the dispatcher does). MHC_SP_NVTX_PHASE("op/phase") opens a child range
// `mhc_sp::op/phase` for a phase of the op (e.g. fused_layer/exchange, fused_layer/gather), in NVTX
// and in torch.profiler. The phase names are listed in mhc_sp.profiling.FUSED_PHASES
// (docs/profiling-nvtx.md).

#include <ATen/record_function.h>

#include <string_view>

#if defined(MHC_SP_WITH_NVTX)
#include <nvtx3/nvToolsExt.h>

namespace mhc_sp {

inline constexpr bool kNvtxBuilt = true;

inline nvtxDomainHandle_t nvtx_domain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("mhc_sp");
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
inline constexpr bool kNvtxBuilt = false;
inline void nvtx_push(const char*) {}
inline void nvtx_pop() {}
}  // namespace mhc_sp
#endif

namespace mhc_sp {

class NvtxOpRange {
 public:
  explicit NvtxOpRange(const char* message) { nvtx_push(message); }
  ~NvtxOpRange() { nvtx_pop(); }
  NvtxOpRange(const NvtxOpRange&) = delete;
  NvtxOpRange& operator=(const NvtxOpRange&) = delete;
};

// The torch.profiler range opens first and closes last, so the two nest the same way.
class NvtxPhaseRange {
 public:
  explicit NvtxPhaseRange(const char* message) {
    if (record_.isActive())
      record_.before(std::string_view(message), c10::ArrayRef<const c10::IValue>{});
    nvtx_push(message);
  }
  ~NvtxPhaseRange() { nvtx_pop(); }
  NvtxPhaseRange(const NvtxPhaseRange&) = delete;
  NvtxPhaseRange& operator=(const NvtxPhaseRange&) = delete;

 private:
  at::RecordFunction record_{at::RecordScope::USER_SCOPE};
};

}  // namespace mhc_sp

#define MHC_SP_NVTX_RANGE(op) ::mhc_sp::NvtxOpRange mhc_sp_nvtx_range_("mhc_sp::" op)
#define MHC_SP_NVTX_PHASE(phase) ::mhc_sp::NvtxPhaseRange mhc_sp_nvtx_phase_("mhc_sp::" phase)
