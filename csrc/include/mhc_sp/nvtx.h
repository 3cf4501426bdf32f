#pragma once
// Scoped NVTX range in the "mhc_sp" domain (header-only NVTX3; a no-op unless a profiler such as
// nsys is attached). Without the CUDA toolkit headers the range compiles to nothing.

#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>

namespace mhc_sp {

struct NvtxDomainTag {
  static constexpr const char* name{"mhc_sp"};
};

class NvtxRange {
 public:
  explicit NvtxRange(const char* message) {
    static const nvtxDomainHandle_t domain = nvtxDomainCreateA(NvtxDomainTag::name);
    domain_ = domain;
    nvtxEventAttributes_t attr{};
    attr.version = NVTX_VERSION;
    attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attr.message.ascii = message;
    nvtxDomainRangePushEx(domain_, &attr);
  }
  ~NvtxRange() { nvtxDomainRangePop(domain_); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  nvtxDomainHandle_t domain_;
};

}  // namespace mhc_sp
#else
namespace mhc_sp {
struct NvtxRange {
  explicit NvtxRange(const char*) {}
};
}  // namespace mhc_sp
#endif

#define MHC_SP_NVTX_RANGE(op) ::mhc_sp::NvtxRange mhc_sp_nvtx_range_("mhc_sp::" op)
