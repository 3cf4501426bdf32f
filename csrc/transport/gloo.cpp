// The gloo transport: the group's own CPU backend (c10d::resolve_process_group). Every
// collective waits for its work: gloo completes on its own threads.

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "mhc_sp/comm.h"

namespace mhc_sp {
namespace {

// torch renamed _allgather_base/_reduce_scatter_base to all_gather_single/reduce_scatter_single
// (2.14 keeps the old names as deprecated aliases; 2.11 on the GPU image has only the old ones).
template <typename PG>
c10::intrusive_ptr<c10d::Work> pg_all_gather(PG& pg, Tensor& out, Tensor& in) {
  if constexpr (requires { pg.all_gather_single(out, in); }) {
    return pg.all_gather_single(out, in);
  } else {
    return pg._allgather_base(out, in);
  }
}

template <typename PG>
c10::intrusive_ptr<c10d::Work> pg_reduce_scatter(PG& pg, Tensor& out, Tensor& in) {
  if constexpr (requires { pg.reduce_scatter_single(out, in); }) {
    return pg.reduce_scatter_single(out, in);
  } else {
    return pg._reduce_scatter_base(out, in);
  }
}

// Reductions of bf16/fp16 are done in fp32 (gloo would otherwise round at every step).
class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroup> pg) : pg_(std::move(pg)) {}

  const char* transport() const override { return "gloo"; }

  void all_gather(Tensor& out, const Tensor& in) override {
    Tensor src = in;
    pg_all_gather(*pg_, out, src)->wait();
  }

  void reduce_scatter(Tensor& out, const Tensor& in) override {
    Tensor src = widen(in);
    Tensor dst = out.scalar_type() == src.scalar_type() ? out : at::empty(out.sizes(), src.options());
    pg_reduce_scatter(*pg_, dst, src)->wait();
    if (!dst.is_same(out)) out.copy_(dst);
  }

  void all_reduce(Tensor& out, const Tensor& in) override {
    std::vector<Tensor> buf{widen(in).clone()};
    pg_->allreduce(buf)->wait();
    out.copy_(buf[0]);
  }

 private:
  static Tensor widen(const Tensor& t) {
    return at::isReducedFloatingType(t.scalar_type()) ? t.to(at::kFloat) : t;
  }
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const std::string& name) {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = c10d::resolve_process_group(name);
  } catch (const std::exception&) {
    TORCH_CHECK_VALUE(false, "group: unknown torch.distributed group '", name, "'");
  }
  try {
    pg->getBackend(c10::DeviceType::CPU);
  } catch (const std::exception&) {
    TORCH_CHECK_VALUE(false, "transport: group '", name,
                      "' has no CPU (gloo) backend; create it with backend 'gloo' or "
                      "'cpu:gloo,cuda:nccl'");
  }
  return std::make_unique<GlooCommunicator>(pg);
}

}  // namespace mhc_sp
