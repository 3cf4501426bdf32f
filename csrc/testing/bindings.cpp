// SPDX-License-Identifier: Apache-2.0
// mhc_sp._testing: what only the tests and the GPU harness use, kept out of the production module
// (built when MHC_SP_TESTING=1). In every build: the symm transport's host arithmetic (layout,
// paths, tags, the call order across streams, error texts) and the CUDA projection's summation
// order on the host, all checked on CPU. In CUDA builds: the simulated ranks of the single-GPU
// harness (testing/symm_sim.h), which run the production kernels' bodies.

#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstring>

#include "cuda/device/leaf_tree.h"
#include "mhc_sp/detail/params.h"
#include "mhc_sp/detail/python_errors.h"
#include "transport/symm/layout.h"

#if defined(MHC_SP_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "testing/symm_errors.h"
#include "testing/symm_sim.h"
#include "transport/symm/kernels.h"
#endif

namespace py = pybind11;

namespace mhc_sp::testing {
namespace {

using namespace ::mhc_sp::symm;  // the host arithmetic under test

Op checked_op(const std::string& op) {
  if (op == "all_gather") return Op::kAllGather;
  if (op == "reduce_scatter") return Op::kReduceScatter;
  if (op == "all_reduce") return Op::kAllReduce;
  if (op == "fused_entry") return Op::kFusedEntry;
  if (op == "fused_layer") return Op::kFusedLayer;
  if (op == "fused_head") return Op::kFusedHead;
  TORCH_CHECK_VALUE(false,
                    "op: expected all_gather, reduce_scatter, all_reduce, fused_entry, "
                    "fused_layer or fused_head, got '",
                    op, "'");
}

CallHeader header_of(const std::string& op, bool sharded, int64_t rows, int64_t num_tokens,
                     int64_t inner, int64_t elem_bytes) {
  TORCH_CHECK_VALUE(rows >= 0, "rows: expected a value >= 0, got ", rows);
  TORCH_CHECK_VALUE(inner >= 1, "inner: expected a value >= 1, got ", inner);
  TORCH_CHECK_VALUE(elem_bytes >= 1 && elem_bytes <= 8, "elem_bytes: expected 1 to 8, got ",
                    elem_bytes);
  CallHeader h{};
  h.op = static_cast<uint32_t>(checked_op(op));
  h.flags = sharded ? boundary::kSharded : 0;
  h.rows = rows;
  h.num_tokens = num_tokens;
  h.inner = inner;
  h.elem_bytes = static_cast<uint32_t>(elem_bytes);
  return h;
}

// The CUDA projection's summation order on the host (cuda/device/leaf_tree.h, the same code the
// kernels run): `leaves` pushed per_block at a time into a block's tree, the blocks' totals then
// into the finish's tree. The block's tree is built three ways, its levels split between registers,
// shared memory and local memory as the kernels split them (hc_mult 4: 3 + 3 + 0; wider leaves:
// some far levels); the three must agree bit for bit, and all must equal one tree over all leaves
// for every per_block (tests/ops/test_leaf_tree.py).
template <int kReg, int kSmem, int kFar>
float leaf_tree_sum_split(const std::vector<float>& leaves, size_t per_block) {
  cuda::LeafTree<1, 32> blocks;
  for (size_t b0 = 0; b0 < leaves.size(); b0 += per_block) {
    float upper[kSmem > 0 ? kSmem : 1] = {};
    cuda::LeafTree<1, kReg, kSmem, kFar> tree;
    tree.upper = upper;
    tree.stride = 1;
    for (size_t j = b0; j < std::min(leaves.size(), b0 + per_block); ++j) tree.push({leaves[j]});
    float total[1];
    tree.total(total);
    blocks.push(total);
  }
  float out[1];
  blocks.total(out);
  return out[0];
}

float leaf_tree_sum(const std::vector<float>& leaves, int64_t per_block) {
  constexpr int64_t kMax = int64_t{1} << 5;  // every split below has 6 levels
  TORCH_CHECK_VALUE(per_block >= 1 && per_block <= kMax && (per_block & (per_block - 1)) == 0,
                    "per_block: expected a power of two in [1, ", kMax, "], got ", per_block);
  TORCH_CHECK_VALUE(!leaves.empty(), "leaves: expected at least one value");
  const size_t n = static_cast<size_t>(per_block);
  const float a = leaf_tree_sum_split<3, 3, 0>(leaves, n);
  const float b = leaf_tree_sum_split<2, 2, 2>(leaves, n);
  const float c = leaf_tree_sum_split<1, 0, 5>(leaves, n);
  TORCH_CHECK(std::memcmp(&a, &b, 4) == 0 && std::memcmp(&a, &c, 4) == 0,
              "mhc_sp: the tree's register, shared and local levels disagree");
  return a;
}

const char* path_name(Path p) {
  switch (p) {
    case Path::kLamport: return "lamport";
    case Path::kExchange: return "exchange";
    default: return "fallback";
  }
}

#if defined(MHC_SP_WITH_CUDA)

cudaStream_t current_stream(const Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

void check_list(const std::vector<Tensor>& v, const char* name, int64_t world) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(v.size()) == world, name,
                    ": expected one tensor per "
                    "simulated rank (",
                    world, "), got ", v.size());
  for (const Tensor& t : v) {
    TORCH_CHECK_VALUE(t.defined() && t.is_cuda(), name, ": expected CUDA tensors");
    check_contiguous(t, name);
  }
}

// The harness's fused_layer: every simulated rank's inputs, checked as the op checks them.
// `production`: the launch production makes (one rank, no cooperative launch, the finish a
// programmatic dependent), for the harness's world of one.
void check_production(bool production, int64_t world, int64_t absent) {
  TORCH_CHECK_VALUE(!production || (world == 1 && absent < 0),
                    "production: the production launch runs one rank that always arrives; this "
                    "group simulates ",
                    world, absent >= 0 ? " with an absent rank" : "");
}

std::vector<LayerOutputs> sim_fused_layer(
    const SymmSimGroup& g, const std::vector<Tensor>& partials,
    const std::vector<Tensor>& residuals, const std::vector<Tensor>& posts,
    const std::vector<Tensor>& combs, const Tensor& fn, const Tensor& hc_scale,
    const Tensor& hc_base, const std::optional<Tensor>& norm_weight, bool sharded,
    int64_t num_tokens, double rms_eps, double hc_pre_eps, double hc_sinkhorn_eps,
    double hc_post_mult, int64_t sinkhorn_iters, double norm_eps, int64_t absent, bool production) {
  const int64_t world = g.world();
  check_production(production, world, absent);
  for (const auto* v : {&partials, &residuals, &posts, &combs}) check_list(*v, "tensors", world);
  const Tensor& ref = residuals[0];
  const StreamShape s = check_stream(ref, "residuals[0]");
  TORCH_CHECK_VALUE(s.n == 4, "residuals: the harness simulates hc_mult 4 only, got ",
                    shape_str(ref));
  TORCH_CHECK_VALUE(s.H % 8 == 0, "residuals: hidden size must be a multiple of 8, got ", s.H);
  const int64_t rows = sharded ? shard_rows(num_tokens, world) : num_tokens;
  TORCH_CHECK_VALUE(num_tokens >= 1, "num_tokens: expected a value >= 1, got ", num_tokens);
  TORCH_CHECK_VALUE(absent >= -1 && absent < world, "absent: expected -1 or a rank, got ", absent);
  const PreWeights w = check_pre_weights(
      fn, hc_scale, hc_base, norm_weight, s, ref, "residuals[0]",
      {rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps});
  std::vector<LayerArgs> calls;
  std::vector<LayerOutputs> outs;
  for (int64_t r = 0; r < world; ++r) {
    TORCH_CHECK_VALUE(residuals[r].sizes() == ref.sizes() && residuals[r].size(0) == rows,
                      "residuals: expected every rank's stream of shape (", rows, ", 4, ", s.H,
                      "), rank ", r, " has ", shape_str(residuals[r]));
    check_stream(residuals[r], "residuals");
    check_tensor(partials[r], "partials", at::kBFloat16, 2, "(tokens, hidden)", ref,
                 "residuals[0]");
    TORCH_CHECK_VALUE(partials[r].size(0) >= num_tokens && partials[r].size(1) == s.H,
                      "partials: expected (>= num_tokens, hidden) per rank, rank ", r, " has ",
                      shape_str(partials[r]));
    const StreamShape shape{rows, s.n, s.H};
    check_post_comb(posts[r], combs[r], shape, ref, "residuals[0]");
    calls.push_back(symm::aligned_layer_args(LayerArgs{
        partials[r], PostInputs{residuals[r], posts[r], combs[r], shape}, w, sharded, num_tokens}));
    outs.push_back(symm::layer_outputs(calls.back()));
  }
  const BufferLayout& L = g.rank(0).layout();
  if (sharded) {
    const CallHeader h = header_of("fused_layer", true, num_tokens, num_tokens, s.H, 2);
    TORCH_CHECK_VALUE(exchange_path(L, h) == Path::kExchange, "num_tokens: ", num_tokens,
                      " tokens do not fit the harness's half of ", L.half_bytes, " bytes");
  } else {
    TORCH_CHECK_VALUE(reduction_path(L, num_tokens, s.H, true) == Path::kLamport,
                      "num_tokens: ", num_tokens, " tokens at hidden ", s.H,
                      " do not fit the Lamport mailbox (at most ", kLamportMaxTokens, " tokens, ",
                      L.mailbox_slot_bytes, " bytes)");
  }
  const c10::cuda::CUDAGuard guard(ref.device());
  g.fused_layer(calls, outs, absent, production, current_stream(ref));
  return outs;
}

std::vector<Tensor> sim_collective(const SymmSimGroup& g, const std::string& op_name,
                                   const std::vector<Tensor>& xs, int64_t num_tokens,
                                   int64_t absent, bool production) {
  const int64_t world = g.world();
  check_production(production, world, absent);
  check_list(xs, "xs", world);
  const Op op = checked_op(op_name);
  TORCH_CHECK_VALUE(op == Op::kAllGather || op == Op::kReduceScatter || op == Op::kAllReduce,
                    "op: expected all_gather, reduce_scatter or all_reduce, got '", op_name, "'");
  TORCH_CHECK_VALUE(xs[0].dim() >= 1 && xs[0].size(0) >= 1, "xs: expected at least one row");
  for (const Tensor& x : xs) {
    TORCH_CHECK_VALUE(x.sizes() == xs[0].sizes() && x.scalar_type() == xs[0].scalar_type(),
                      "xs: every rank's tensor must have the same shape and dtype");
  }
  const int64_t rows = xs[0].size(0);
  std::vector<Tensor> outs;
  for (const Tensor& x : xs) {
    auto sizes = x.sizes().vec();
    // reduce_scatter: each rank's shard of ceil(rows / world) rows, rows past `rows` zeros.
    if (op == Op::kReduceScatter) sizes[0] = shard_rows(rows, world);
    if (op == Op::kAllGather) sizes[0] = num_tokens < 0 ? rows * world : num_tokens;
    outs.push_back(at::empty(sizes, x.options()));
  }
  const int64_t row_bytes = xs[0].numel() / rows * xs[0].element_size();
  const Path path = collective_path(g.rank(0).layout(), op, rows, row_bytes,
                                    xs[0].scalar_type() == at::kBFloat16);
  TORCH_CHECK_VALUE(path != Path::kFallback,
                    "xs: this call does not fit the harness's workspace or dtype (",
                    shape_str(xs[0]), ", ", xs[0].scalar_type(), ")");
  std::vector<Tensor> ins;
  for (const Tensor& x : xs) ins.push_back(symm::aligned(x));
  const c10::cuda::CUDAGuard guard(xs[0].device());
  g.collective(op, outs, ins, op == Op::kAllGather ? num_tokens : -1, path == Path::kLamport,
               absent, production, current_stream(xs[0]));
  return outs;
}
#endif  // MHC_SP_WITH_CUDA

void bind(py::module_& m) {
  m.def(
      "symm_flag_offset",
      [](int64_t world, int64_t block, int64_t src) {
        TORCH_CHECK_VALUE(block >= 0 && block < kMaxBlocks, "block: expected [0, ", kMaxBlocks,
                          ")");
        TORCH_CHECK_VALUE(src >= 0 && src < world, "src: expected [0, ", world, ")");
        return flag_offset(checked_buffer_layout(world, 16, kPage), block, src);
      },
      py::arg("world"), py::arg("block"), py::arg("src"));
  m.def("symm_mailbox_index", [](uint64_t call) { return mailbox_index(call); }, py::arg("call"));
  m.def("symm_half_index", [](uint64_t call) { return half_index(call); }, py::arg("call"));
  m.def(
      "symm_exchange_layout",
      [](const std::string& op, bool sharded, int64_t rows, int64_t num_tokens, int64_t inner,
         int64_t elem_bytes, int64_t world, int64_t half_bytes) {
        const BufferLayout L = checked_buffer_layout(world, 16, half_bytes);
        const ExchangeLayout X = exchange_layout(
            header_of(op, sharded, rows, num_tokens, inner, elem_bytes), world, L.half_bytes);
        py::dict d;
        d["in_rows"] = X.in_rows;
        d["out_rows"] = X.out_rows;
        d["row_bytes"] = X.row_bytes;
        d["landing_offset"] = X.landing_offset;
        d["landing_stride"] = X.landing_stride;
        d["out_offset"] = X.out_offset;
        d["need"] = X.need;
        return d;
      },
      py::arg("op"), py::arg("sharded"), py::arg("rows"), py::arg("num_tokens"), py::arg("inner"),
      py::arg("elem_bytes"), py::arg("world"), py::arg("half_bytes") = kDefaultHalfBytes);
  m.def(
      "symm_path",
      [](const std::string& op, bool sharded, int64_t rows, int64_t num_tokens, int64_t inner,
         int64_t world, int64_t mailbox_slot_bytes, int64_t half_bytes) {
        const BufferLayout L = checked_buffer_layout(world, mailbox_slot_bytes, half_bytes);
        const Op o = checked_op(op);
        if (o == Op::kAllReduce || (o == Op::kFusedLayer && !sharded)) {
          return path_name(reduction_path(L, rows, inner, o == Op::kFusedLayer));
        }
        return path_name(exchange_path(L, header_of(op, sharded, rows, num_tokens, inner * 2, 1)));
      },
      py::arg("op"), py::arg("sharded"), py::arg("rows"), py::arg("num_tokens"), py::arg("inner"),
      py::arg("world"), py::arg("mailbox_slot_bytes"), py::arg("half_bytes"));
  m.def("symm_checked_peer_table", &checked_peer_table, py::arg("ptrs"), py::arg("rank"),
        py::arg("world"), py::arg("local"));
  m.def(
      "symm_lamport_tag",
      [](const std::string& op, int64_t rows, int64_t inner, uint64_t call, int64_t blocks,
         int64_t chunks_per_split) {
        TORCH_CHECK_VALUE(blocks >= 1 && blocks <= kMaxBlocks, "blocks: expected [1, ", kMaxBlocks,
                          "], got ", blocks);
        const LamportTag t =
            lamport_tag(checked_op(op), rows, inner, call, blocks, chunks_per_split);
        return std::vector<int64_t>(t.lane, t.lane + 8);
      },
      py::arg("op"), py::arg("rows"), py::arg("inner"), py::arg("call"), py::arg("blocks") = 1,
      py::arg("chunks_per_split") = 1);
  m.def("leaf_tree_sum", &leaf_tree_sum, py::arg("leaves"), py::arg("per_block"));
  m.def(
      "symm_describe_error",
      [](const std::string& code, int64_t rank, int64_t peer, int64_t block, int64_t phase,
         uint64_t epoch, double waited_s, const std::string& group, double timeout_s) {
        ErrorRecord e{};
        e.code = code == "timeout"       ? kTimeout
                 : code == "mismatch"    ? kMismatch
                 : code == "peer_broken" ? kPeerBroken
                                         : 99;
        e.rank = static_cast<int32_t>(rank);
        e.peer = static_cast<int32_t>(peer);
        e.block = static_cast<int32_t>(block);
        e.phase = static_cast<uint32_t>(phase);
        e.epoch = epoch;
        e.waited_ns = static_cast<uint64_t>(waited_s * 1e9);
        return describe_error(e, group, timeout_s);
      },
      py::arg("code"), py::arg("rank"), py::arg("peer"), py::arg("block"), py::arg("phase"),
      py::arg("epoch"), py::arg("waited_s"), py::arg("group"), py::arg("timeout_s"));

#if defined(MHC_SP_WITH_CUDA)
  m.attr("max_sim_ranks") = kMaxSimRanks;
  py::class_<SymmSimGroup>(m, "SymmSimGroup",
                           "Simulated ranks of one symm group on this GPU (the harness)")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, double>(), py::arg("world"),
           py::arg("device"), py::arg("mailbox_slot_bytes"), py::arg("half_bytes"),
           py::arg("timeout_s"))
      .def_property_readonly("world", &SymmSimGroup::world)
      .def("fused_layer", &sim_fused_layer, py::arg("partials"), py::arg("residuals"),
           py::arg("posts"), py::arg("combs"), py::arg("fn"), py::arg("hc_scale"),
           py::arg("hc_base"), py::arg("norm_weight"), py::arg("sharded"), py::arg("num_tokens"),
           py::arg("rms_eps"), py::arg("hc_pre_eps"), py::arg("hc_sinkhorn_eps"),
           py::arg("hc_post_mult"), py::arg("sinkhorn_iters"), py::arg("norm_eps"),
           py::arg("absent") = -1, py::arg("production") = false)
      .def("collective", &sim_collective, py::arg("op"), py::arg("xs"), py::arg("num_tokens") = -1,
           py::arg("absent") = -1, py::arg("production") = false)
      .def("errors",
           [](const SymmSimGroup& g) {
             py::list out;
             for (int64_t r = 0; r < g.world(); ++r) out.append(error_dict(g.rank(r).error()));
             return out;
           })
      .def(
          "describe_error",
          [](const SymmSimGroup& g, int64_t rank) {
            const ErrorRecord e = g.rank(rank).error();
            return e.code == kNoError ? std::string()
                                      : describe_error(e, "harness", g.rank(rank).timeout_s());
          },
          py::arg("rank"));
#endif
}

}  // namespace
}  // namespace mhc_sp::testing

PYBIND11_MODULE(_testing, m) {
  m.doc() = "mhc_sp test-only machinery: symm host arithmetic, the single-GPU symm harness";
  mhc_sp::register_error_translator();
  mhc_sp::testing::bind(m);
}
