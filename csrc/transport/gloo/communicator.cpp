// SPDX-License-Identifier: Apache-2.0
// The gloo transport: the group's own CPU backend (c10d::resolve_process_group). Every
// collective waits for its work: gloo completes on its own threads.
//
// Reductions do not use gloo's own: its ring adds each chunk in an order that depends on the
// chunk and the world (for 3 or more ranks not rank order), at the data's precision. gloo only
// moves the data here: an all-to-all brings every rank each rank's part of its share, which it
// adds itself in rank order (rank_order_sum, the rule of every transport); all_reduce then
// all-gathers the summed shares.

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "transport/gloo/transport.h"
#include "transport/rank_order_sum.h"

namespace mhc_sp {
namespace {

// torch renamed _allgather_base/alltoall_base to all_gather_single/all_to_all_single (2.14 keeps
// the old names as deprecated aliases; 2.11 on the GPU image has only the old ones).
template <typename PG>
c10::intrusive_ptr<c10d::Work> pg_all_gather(PG& pg, Tensor& out, Tensor& in) {
  if constexpr (requires { pg.all_gather_single(out, in); }) {
    return pg.all_gather_single(out, in);
  } else {
    return pg._allgather_base(out, in);
  }
}

template <typename PG>
c10::intrusive_ptr<c10d::Work> pg_all_to_all(PG& pg, Tensor& out, Tensor& in) {
  std::vector<int64_t> even;  // no split sizes: equal splits
  if constexpr (requires { pg.all_to_all_single(out, in, even, even); }) {
    return pg.all_to_all_single(out, in, even, even);
  } else {
    return pg.alltoall_base(out, in, even, even);
  }
}

// The world's parts of a (world * count) gathered buffer, in rank order.
std::vector<const void*> rank_parts(const Tensor& gathered, int64_t world, int64_t count) {
  std::vector<const void*> parts;
  const auto* base = static_cast<const uint8_t*>(gathered.const_data_ptr());
  for (int64_t r = 0; r < world; ++r) parts.push_back(base + r * count * gathered.element_size());
  return parts;
}

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroup> pg) : pg_(std::move(pg)) {}

  const char* transport() const override { return "gloo"; }

  void all_gather(Tensor& out, const Tensor& in) override {
    Tensor src = in;
    pg_all_gather(*pg_, out, src)->wait();
  }

  void reduce_scatter(Tensor& out, const Tensor& in) override {
    sum_own_share(out, in.reshape({-1}));
  }

  // The flattened input zero-padded to world equal shares: each rank sums its share, then the
  // shares are gathered.
  void all_reduce(Tensor& out, const Tensor& in) override {
    const int64_t world = pg_->getSize(), count = in.numel();
    const int64_t share = (count + world - 1) / world;
    Tensor src = in.reshape({-1});
    if (share * world != count) {
      Tensor padded = at::zeros({share * world}, in.options());
      padded.narrow(0, 0, count).copy_(src);
      src = padded;
    }
    Tensor mine = at::empty({share}, in.options());
    sum_own_share(mine, src);
    Tensor gathered = at::empty({share * world}, in.options());
    pg_all_gather(*pg_, gathered, mine)->wait();
    out.view({-1}).copy_(gathered.narrow(0, 0, count));
  }

 private:
  // out (share elements) <- the rank-order sum of every rank's share number `rank` of `flat`
  // (world * share elements): the all-to-all brings rank r's part to block r of `received`.
  void sum_own_share(Tensor& out, Tensor flat) {
    const int64_t world = pg_->getSize(), share = out.numel();
    Tensor received = at::empty({world * share}, flat.options());
    pg_all_to_all(*pg_, received, flat)->wait();
    rank_order_sum(out.data_ptr(), rank_parts(received, world, share), share, flat.scalar_type());
  }

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
};

}  // namespace

std::unique_ptr<Communicator> gloo::make_communicator(const std::string& name) {
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
