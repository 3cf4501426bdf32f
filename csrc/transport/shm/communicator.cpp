// SPDX-License-Identifier: Apache-2.0
// The shm transport: the collectives and the one-pass fused boundaries over a group's
// shared-memory workspace (transport/shm/workspace.h; protocol in
// mhc_sp/detail/boundary_protocol.h).
//
// fused_layer, sharded, on rank r of W (S = ceil(num_tokens / W) rows per shard):
//   1. copy the partial's num_tokens rows, but for this rank's own tokens, into this rank's
//      slot; barrier (+ header check)
//   2. post+pre over this rank's real rows, the kernel reading x as the rank-order fp32 sum of
//      every rank's partial rows [r*S, r*S + rows), straight from the peers' slots and from the
//      rank's own partial; layer_input is written into this rank's rows of the gathered
//      (num_tokens, H) output, which is private, and then copied into this rank's slot (so a
//      rank that was stopped mid-math and resumes after its peers gave up writes nothing into
//      the segment); padding rows of the stream outputs are zeros
//   3. barrier; copy the peers' layer_input rows into the gathered output.
// Replicated: steps 1 and 2 over all rows, outputs kept local, one barrier.

#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "mhc_sp/detail/impl.h"
#include "mhc_sp/detail/nvtx.h"
#include "transport/rank_order_sum.h"
#include "transport/shm/transport.h"
#include "transport/shm/workspace.h"

namespace mhc_sp {
namespace {

namespace bp = ::mhc_sp::boundary;
using shm::Call;

// Large copies split across the threads the op may use; small ones stay on this thread.
void copy_bytes(void* dst, const void* src, int64_t bytes) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  if (bytes <= 0) return;
  at::parallel_for(0, (bytes + kChunk - 1) / kChunk, 4, [&](int64_t begin, int64_t end) {
    const int64_t lo = begin * kChunk, hi = std::min(bytes, end * kChunk);
    std::memcpy(static_cast<uint8_t*>(dst) + lo, static_cast<const uint8_t*>(src) + lo, hi - lo);
  });
}

int64_t inner_elements(const Tensor& t) {
  int64_t inner = 1;
  for (int64_t d = 1; d < t.dim(); ++d) inner *= t.size(d);
  return inner;
}

// Rows [from, end) of a (rows, ...) tensor set to zero: the stream's padding rows.
void zero_rows_from(Tensor& t, int64_t from) {
  if (from < t.size(0)) t.narrow(0, from, t.size(0) - from).zero_();
}

const BFloat16* bf16(const uint8_t* p) { return reinterpret_cast<const BFloat16*>(p); }

class ShmCommunicator final : public Communicator, public FusedBoundary {
 public:
  ShmCommunicator(const std::string& group, int64_t rank, int64_t world, const std::string& segment,
                  std::chrono::milliseconds timeout)
      : ws_(group, rank, world, segment, timeout) {}

  const char* transport() const override { return "shm"; }
  FusedBoundary* fused() override { return this; }

  void all_gather(Tensor& out, const Tensor& in) override {
    Call call =
        ws_.start(bp::Op::kAllGather, 0, in.size(0), -1, inner_elements(in), in.scalar_type());
    const int64_t bytes = static_cast<int64_t>(in.nbytes());
    call.write_in(in.const_data_ptr(), 0, bytes);
    call.publish();
    for (int64_t r = 0; r < call.world(); ++r) {
      copy_bytes(static_cast<uint8_t*>(out.data_ptr()) + r * bytes, call.peer_in(r), bytes);
    }
    call.finish();
  }

  void reduce_scatter(Tensor& out, const Tensor& in) override {
    Call call =
        ws_.start(bp::Op::kReduceScatter, 0, in.size(0), -1, inner_elements(in), in.scalar_type());
    call.write_in(in.const_data_ptr(), 0, static_cast<int64_t>(in.nbytes()));
    call.publish();
    const int64_t shard_bytes = static_cast<int64_t>(out.nbytes());
    std::vector<const void*> parts;
    for (int64_t r = 0; r < call.world(); ++r)
      parts.push_back(call.peer_in(r) + ws_.rank() * shard_bytes);
    rank_order_sum(out.data_ptr(), parts, out.numel(), in.scalar_type());
    call.finish();
  }

  void all_reduce(Tensor& out, const Tensor& in) override {
    Call call =
        ws_.start(bp::Op::kAllReduce, 0, in.size(0), -1, inner_elements(in), in.scalar_type());
    call.write_in(in.const_data_ptr(), 0, static_cast<int64_t>(in.nbytes()));
    call.publish();
    std::vector<const void*> parts;
    for (int64_t r = 0; r < call.world(); ++r) parts.push_back(call.peer_in(r));
    rank_order_sum(out.data_ptr(), parts, out.numel(), in.scalar_type());
    call.finish();
  }

  std::optional<EntryOutputs> fused_entry(const EntryArgs& a) override {
    const StreamShape& s = a.stream;
    if (!a.sharded) {
      MHC_SP_NVTX_PHASE("fused_entry/pre");
      return mhc_pre_broadcast_impl(a.x, s, a.pre);
    }
    const int64_t tokens = a.x.size(0), rows = s.T;
    const int64_t valid = real_rows(true, tokens);
    Call call = ws_.start(bp::Op::kFusedEntry, bp::kSharded, 0, tokens, s.H, at::kBFloat16);
    Tensor residual = at::empty({rows, s.n, s.H}, a.x.options());
    Tensor post = at::empty({rows, s.n}, a.x.options().dtype(at::kFloat));
    Tensor comb = at::empty({rows, s.n, s.n}, a.x.options().dtype(at::kFloat));
    Tensor layer_input = at::empty({tokens, s.H}, a.x.options());
    {
      MHC_SP_NVTX_PHASE("fused_entry/pre");
      if (valid > 0) {
        cpu_kernels().mhc_pre_broadcast(
            a.x.const_data_ptr<BFloat16>() + ws_.rank() * rows * s.H, residual.data_ptr<BFloat16>(),
            pre_kernel_params(broadcast_weights(a.pre, s), valid, s, post.data_ptr<float>(),
                              comb.data_ptr<float>(), own_rows(layer_input, rows)));
      }
      zero_rows_from(residual, valid);
      zero_rows_from(post, valid);
      zero_rows_from(comb, valid);
    }
    {
      MHC_SP_NVTX_PHASE("fused_entry/gather");
      share_own_rows(call, layer_input, rows, valid);
      call.publish();
      gather_peer_rows(call, layer_input, rows);
    }
    call.finish();
    return EntryOutputs{residual, post, comb, layer_input};
  }

  std::optional<LayerOutputs> fused_layer(const LayerArgs& a) override {
    const StreamShape& s = a.in.shape;
    const int64_t tokens = a.num_tokens, rows = s.T;
    const int64_t valid = real_rows(a.sharded, tokens);
    Call call = ws_.start(bp::Op::kFusedLayer, a.sharded ? bp::kSharded : 0, tokens, tokens, s.H,
                          at::kBFloat16);
    {
      MHC_SP_NVTX_PHASE("fused_layer/exchange");
      publish_partial(call, a.partial, tokens, a.sharded ? rows : 0, valid);
      call.publish();
    }
    const auto f32 = a.in.residual.options().dtype(at::kFloat);
    Tensor residual_out = at::empty_like(a.in.residual);
    Tensor post = at::empty({rows, s.n}, f32);
    Tensor comb = at::empty({rows, s.n, s.n}, f32);
    Tensor layer_input = at::empty({tokens, s.H}, a.in.residual.options());
    {
      MHC_SP_NVTX_PHASE("fused_layer/post_pre");
      if (valid > 0) {
        const auto parts = shard_parts(call, a.partial, a.sharded ? rows : 0, s.H);
        BFloat16* out = own_rows(layer_input, a.sharded ? rows : 0);
        cpu_kernels().mhc_post_pre(
            post_kernel_params(a.in, valid, summed(parts), residual_out.data_ptr<BFloat16>()),
            pre_kernel_params(a.pre, valid, s, post.data_ptr<float>(), comb.data_ptr<float>(),
                              out));
      }
      zero_rows_from(residual_out, valid);
      zero_rows_from(post, valid);
      zero_rows_from(comb, valid);
    }
    if (a.sharded) {
      MHC_SP_NVTX_PHASE("fused_layer/gather");
      gather_after_barrier(call, layer_input, rows, valid);
    }
    call.finish();
    return LayerOutputs{residual_out, post, comb, layer_input};
  }

  std::optional<HeadOutputs> fused_head(const HeadArgs& a) override {
    const StreamShape& s = a.in.shape;
    const int64_t tokens = a.num_tokens, rows = s.T;
    const int64_t valid = real_rows(a.sharded, tokens);
    Call call = ws_.start(bp::Op::kFusedHead, a.sharded ? bp::kSharded : 0, tokens, tokens, s.H,
                          at::kBFloat16);
    {
      MHC_SP_NVTX_PHASE("fused_head/exchange");
      publish_partial(call, a.partial, tokens, a.sharded ? rows : 0, valid);
      call.publish();
    }
    Tensor residual_out = at::empty_like(a.in.residual);
    Tensor hidden = at::empty({tokens, s.H}, a.in.residual.options());
    {
      MHC_SP_NVTX_PHASE("fused_head/post_head");
      if (valid > 0) {
        const auto parts = shard_parts(call, a.partial, a.sharded ? rows : 0, s.H);
        cpu_kernels().mhc_post(
            post_kernel_params(a.in, valid, summed(parts), residual_out.data_ptr<BFloat16>()));
        BFloat16* out = own_rows(hidden, a.sharded ? rows : 0);
        cpu_kernels().hc_head(residual_out.const_data_ptr<BFloat16>(),
                              head_kernel_params(a.head, valid, s, out));
      }
      zero_rows_from(residual_out, valid);
    }
    if (a.sharded) {
      MHC_SP_NVTX_PHASE("fused_head/gather");
      gather_after_barrier(call, hidden, rows, valid);
    }
    call.finish();
    return HeadOutputs{hidden, residual_out};
  }

 private:
  // This rank's real rows of a boundary of `tokens` tokens: its shard's, or all when replicated.
  int64_t real_rows(bool sharded, int64_t tokens) const {
    return sharded ? bp::shard_valid_rows(tokens, ws_.world(), ws_.rank()) : tokens;
  }

  // The sharded boundary's last step: this rank's `valid` rows of `out` published, a barrier, the
  // peers' rows copied into `out`.
  static void gather_after_barrier(Call& call, Tensor& out, int64_t shard_rows, int64_t valid) {
    share_own_rows(call, out, shard_rows, valid);
    call.barrier();
    gather_peer_rows(call, out, shard_rows);
  }

  // The partial's first `tokens` rows into this rank's slot, for the peers: all of them when
  // replicated (shard_rows == 0), else all but this rank's own `valid` rows (it reads those from
  // the partial itself).
  void publish_partial(Call& call, const Tensor& partial, int64_t tokens, int64_t shard_rows,
                       int64_t valid) const {
    const int64_t row_bytes = partial.size(1) * 2;
    const auto* src = static_cast<const uint8_t*>(partial.const_data_ptr());
    const int64_t own = std::min(ws_.rank() * shard_rows, tokens);
    const int64_t own_end = shard_rows ? own + valid : 0;
    call.write_in(src, 0, (shard_rows ? own : tokens) * row_bytes);
    if (shard_rows) {
      call.write_in(src + own_end * row_bytes, own_end * row_bytes, (tokens - own_end) * row_bytes);
    }
  }

  // Every rank's partial rows of this rank's tokens (from row rank * shard_rows), in rank order:
  // the peers' from their slots, this rank's own from its partial.
  std::vector<const BFloat16*> shard_parts(const Call& call, const Tensor& partial,
                                           int64_t shard_rows, int64_t H) const {
    std::vector<const BFloat16*> parts;
    for (int64_t r = 0; r < call.world(); ++r) {
      const BFloat16* base =
          r == ws_.rank() ? partial.const_data_ptr<BFloat16>() : bf16(call.peer_in(r));
      parts.push_back(base + ws_.rank() * shard_rows * H);
    }
    return parts;
  }

  // x of the post: the rank-order sum of every rank's partial rows of this rank's tokens.
  static XSource summed(const std::vector<const BFloat16*>& parts) {
    return XSource::rank_order_sum(parts.data(), static_cast<int64_t>(parts.size()));
  }

  // This rank's rows of a (tokens, H) output, from row rank * shard_rows (replicated: 0).
  BFloat16* own_rows(Tensor& out, int64_t shard_rows) const {
    return out.data_ptr<BFloat16>() + ws_.rank() * shard_rows * out.size(1);
  }

  // This rank's `valid` rows of the gathered output into its slot's `out` rows, for the peers.
  static void share_own_rows(Call& call, const Tensor& out, int64_t shard_rows, int64_t valid) {
    const int64_t row_bytes = out.size(1) * 2;
    const auto* src = static_cast<const uint8_t*>(out.const_data_ptr());
    if (valid > 0) call.write_out(src + call.rank() * shard_rows * row_bytes, 0, valid * row_bytes);
  }

  // Every peer's published rows (shards of `shard_rows` rows) into the gathered output.
  static void gather_peer_rows(const Call& call, Tensor& out, int64_t shard_rows) {
    const int64_t tokens = out.size(0), row_bytes = out.size(1) * 2;
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    for (int64_t r = 0; r < call.world(); ++r) {
      if (r == call.rank()) continue;
      const int64_t n = bp::shard_valid_rows(tokens, call.world(), r);
      copy_bytes(dst + r * shard_rows * row_bytes, call.peer_out(r), n * row_bytes);
    }
  }

  shm::Workspace ws_;
};

}  // namespace

std::unique_ptr<Communicator> shm::make_communicator(const std::string& name,
                                                     const std::string& segment,
                                                     std::chrono::milliseconds timeout) {
  const GroupHandle g = registered_group(name);
  return std::make_unique<ShmCommunicator>(name, g.rank, g.world, segment, timeout);
}

}  // namespace mhc_sp
