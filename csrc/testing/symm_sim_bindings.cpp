// SPDX-License-Identifier: Apache-2.0
// The Python class of the symm harness (testing/symm_sim_bindings.h): every simulated rank's
// inputs checked as the ops check them, then one launch of the harness's kernels (or the
// production launch, for a world of one).

#include "testing/symm_sim_bindings.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "mhc_sp/detail/params.h"
#include "testing/symm_args.h"
#include "testing/symm_errors.h"
#include "testing/symm_sim.h"
#include "transport/symm/kernels.h"

namespace py = pybind11;

namespace mhc_sp::testing {
namespace {

using namespace ::mhc_sp::symm;  // NOLINT: the harness checks calls as the symm entries do

// One tensor per simulated rank, each in the group's memory (a GPU's, or the emulated device's:
// CPU tensors).
void check_list(const SymmSimGroup& g, const std::vector<Tensor>& v, const char* name) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(v.size()) == g.world(), name,
                    ": expected one tensor per simulated rank (", g.world(), "), got ", v.size());
  for (const Tensor& t : v) {
    TORCH_CHECK_VALUE(t.defined() && t.device() == g.memory(), name,
                      ": expected tensors on the group's device (", g.memory(), "), got ",
                      t.defined() ? t.device().str() : std::string("an undefined tensor"));
    check_contiguous(t, name);
  }
}

// The harness's calls run on the current stream of the group's device.
cudaStream_t stream_of(const SymmSimGroup& g) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(g.device())).stream();
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
  check_list(g, partials, "partials");
  check_list(g, residuals, "residuals");
  check_list(g, posts, "posts");
  check_list(g, combs, "combs");
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
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(g.device()));
  g.fused_layer(calls, outs, absent, production, stream_of(g));
  return outs;
}

std::vector<Tensor> sim_collective(const SymmSimGroup& g, const std::string& op_name,
                                   const std::vector<Tensor>& xs, int64_t num_tokens,
                                   int64_t absent, bool production) {
  const int64_t world = g.world();
  check_production(production, world, absent);
  check_list(g, xs, "xs");
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
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(g.device()));
  g.collective(op, outs, ins, op == Op::kAllGather ? num_tokens : -1, path == Path::kLamport,
               absent, production, stream_of(g));
  return outs;
}

}  // namespace

void bind_symm_sim(py::module_& m) {
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.attr("max_sim_ranks") = kMaxSimRanks;
  // module_local: the testing module and the emulated device's module each bind their own.
  py::class_<SymmSimGroup>(m, "SymmSimGroup", py::module_local(),
                           "Simulated ranks of one symm group on one device (the harness)")
      .def(py::init<int64_t, int64_t, int64_t, int64_t, double>(), py::arg("world"),
           py::arg("device"), py::arg("mailbox_slot_bytes"), py::arg("half_bytes"),
           py::arg("timeout_s"))
      .def_property_readonly("world", &SymmSimGroup::world)
      .def("fused_layer", &sim_fused_layer, py::arg("partials"), py::arg("residuals"),
           py::arg("posts"), py::arg("combs"), py::arg("fn"), py::arg("hc_scale"),
           py::arg("hc_base"), py::arg("norm_weight"), py::arg("sharded"), py::arg("num_tokens"),
           py::arg("rms_eps"), py::arg("hc_pre_eps"), py::arg("hc_sinkhorn_eps"),
           py::arg("hc_post_mult"), py::arg("sinkhorn_iters"), py::arg("norm_eps"),
           py::arg("absent") = -1, py::arg("production") = false, nogil)
      .def("collective", &sim_collective, py::arg("op"), py::arg("xs"), py::arg("num_tokens") = -1,
           py::arg("absent") = -1, py::arg("production") = false, nogil)
      .def_property_readonly("device", &SymmSimGroup::device)
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
}

}  // namespace mhc_sp::testing
