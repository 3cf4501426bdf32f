// SPDX-License-Identifier: Apache-2.0
// All op schemas (docs/design.md §2, the contract engines call), and the Python module mhc_sp._C.
// One implementation per op serves the CPU and CUDA dispatch keys (registered below); fake
// (meta) implementations live in python/mhc_sp/_fake.py.

#include <Python.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#if defined(MHC_SP_WITH_CUDA)
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#include "mhc_sp/comm.h"
#include "mhc_sp/detail/kernels.h"
#include "mhc_sp/detail/nvtx.h"
#include "mhc_sp/ops.h"
#include "mhc_sp/detail/python_errors.h"
#include "transport/gloo/transport.h"
#include "transport/shm/transport.h"
#include "transport/symm/transport.h"
#if defined(MHC_SP_WITH_CUDA)
#include "transport/nccl/transport.h"
#endif

// Every schema is written out in full, one per op, so that grepping an op's name finds its whole
// signature. The math ops end in the scalar tail of docs/design.md §2: rms_eps, hc_pre_eps,
// hc_sinkhorn_eps, hc_post_mult, sinkhorn_iters, norm_eps.
TORCH_LIBRARY(mhc_sp, m) {
  m.set_python_module("mhc_sp._fake");

  // Project the stream, Sinkhorn the mixing matrix, collapse into the sublayer input (+ RMSNorm).
  m.def(
      "mhc_pre(Tensor residual, Tensor fn, Tensor hc_scale, Tensor hc_base, Tensor? norm_weight, "
      "float rms_eps, float hc_pre_eps, float hc_sinkhorn_eps, float hc_post_mult, "
      "int sinkhorn_iters, float norm_eps) -> (Tensor post, Tensor comb, Tensor layer_input)");
  // Write a sublayer output back into the n streams: post * x + comb^T * residual.
  m.def("mhc_post(Tensor x, Tensor residual, Tensor post, Tensor comb) -> Tensor");
  // mhc_post, then mhc_pre of the next sublayer on its output, in one pass over the stream.
  m.def(
      "mhc_post_pre(Tensor x, Tensor residual, Tensor post, Tensor comb, Tensor fn, "
      "Tensor hc_scale, Tensor hc_base, Tensor? norm_weight, float rms_eps, float hc_pre_eps, "
      "float hc_sinkhorn_eps, float hc_post_mult, int sinkhorn_iters, float norm_eps) "
      "-> (Tensor residual_out, Tensor post, Tensor comb, Tensor layer_input)");
  // First layer: replicate the embedding output into n streams, then mhc_pre.
  m.def(
      "mhc_pre_broadcast(Tensor x, Tensor fn, Tensor hc_scale, Tensor hc_base, "
      "Tensor? norm_weight, float rms_eps, float hc_pre_eps, float hc_sinkhorn_eps, "
      "float hc_post_mult, int sinkhorn_iters, float norm_eps) "
      "-> (Tensor residual_out, Tensor post, Tensor comb, Tensor layer_input)");
  // Final collapse of the n streams into one hidden state.
  m.def(
      "hc_head(Tensor residual, Tensor fn, Tensor hc_scale, Tensor hc_base, float rms_eps, "
      "float hc_eps) -> Tensor");

  // Zero-pad dim 0 to a multiple of world_size and return rank's rows.
  m.def("shard_tokens(Tensor x, int rank, int world_size) -> Tensor");
  // Concatenate every rank's x along dim 0; keep the first num_tokens rows (-1: all).
  m.def("all_gather(Tensor x, str group, int num_tokens) -> Tensor");
  // Sum over the group; return this rank's ceil(T / world) rows (dim 0 zero-padded).
  m.def("reduce_scatter(Tensor x, str group) -> Tensor");
  // Sum over the group, out of place.
  m.def("all_reduce(Tensor x, str group) -> Tensor");

  // First boundary: (own rows of) the embedding output -> broadcast-pre -> gathered layer_input.
  m.def(
      "fused_entry(Tensor x, Tensor fn, Tensor hc_scale, Tensor hc_base, Tensor? norm_weight, "
      "str group, bool sharded, float rms_eps, float hc_pre_eps, float hc_sinkhorn_eps, "
      "float hc_post_mult, int sinkhorn_iters, float norm_eps) "
      "-> (Tensor residual, Tensor post, Tensor comb, Tensor layer_input)");
  // A sublayer boundary: reduce-scatter (or all-reduce) -> post -> pre -> all-gather.
  m.def(
      "fused_layer(Tensor partial, Tensor residual, Tensor post, Tensor comb, Tensor fn, "
      "Tensor hc_scale, Tensor hc_base, Tensor? norm_weight, str group, bool sharded, "
      "int num_tokens, float rms_eps, float hc_pre_eps, float hc_sinkhorn_eps, "
      "float hc_post_mult, int sinkhorn_iters, float norm_eps) "
      "-> (Tensor residual_out, Tensor post_out, Tensor comb_out, Tensor layer_input)");
  // Last boundary: reduce-scatter (or all-reduce) -> post -> hc_head -> all-gather the hidden.
  m.def(
      "fused_head(Tensor partial, Tensor residual, Tensor post, Tensor comb, Tensor head_fn, "
      "Tensor head_scale, Tensor head_base, str group, bool sharded, int num_tokens, "
      "float rms_eps, float hc_eps) -> (Tensor hidden, Tensor residual_out)");
}

namespace {

// One implementation per op serves both dispatch keys: it runs the kernels of the tensors' device.
void register_impls(torch::Library& m) {
  m.impl("mhc_pre", &mhc_sp::mhc_pre);
  m.impl("mhc_post", &mhc_sp::mhc_post);
  m.impl("mhc_post_pre", &mhc_sp::mhc_post_pre);
  m.impl("mhc_pre_broadcast", &mhc_sp::mhc_pre_broadcast);
  m.impl("hc_head", &mhc_sp::hc_head);
  m.impl("shard_tokens", &mhc_sp::shard_tokens);
  m.impl("all_gather", &mhc_sp::all_gather);
  m.impl("reduce_scatter", &mhc_sp::reduce_scatter);
  m.impl("all_reduce", &mhc_sp::all_reduce);
  m.impl("fused_entry", &mhc_sp::fused_entry);
  m.impl("fused_layer", &mhc_sp::fused_layer);
  m.impl("fused_head", &mhc_sp::fused_head);
}

}  // namespace

TORCH_LIBRARY_IMPL(mhc_sp, CPU, m) { register_impls(m); }
#if defined(MHC_SP_WITH_CUDA)
TORCH_LIBRARY_IMPL(mhc_sp, CUDA, m) { register_impls(m); }
#endif

namespace {

pybind11::dict build_info() {
  pybind11::dict info;
  info["torch_version"] = MHC_SP_TORCH_VERSION;
  info["cpu_kernels"] = mhc_sp::cpu_kernels().name;
  info["nvtx"] = mhc_sp::kNvtxBuilt;
#if defined(MHC_SP_WITH_CUDA)
  info["cuda"] = true;
  info["cuda_arch_list"] = MHC_SP_CUDA_ARCH_LIST;
  info["cuda_runtime_built"] = CUDART_VERSION;
  info["nccl_version"] = pybind11::make_tuple(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  int nccl_runtime = 0;
  if (ncclGetVersion(&nccl_runtime) == ncclSuccess) info["nccl_runtime_version"] = nccl_runtime;
#else
  info["cuda"] = false;
  info["cuda_arch_list"] = pybind11::none();
  info["cuda_runtime_built"] = pybind11::none();
  info["nccl_version"] = pybind11::none();
#endif
  return info;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "mhc_sp native extension: registers torch.ops.mhc_sp.* on import";
  mhc_sp::register_error_translator();  // helpers below raise c10 errors
  m.def("build_info", &build_info,
        "torch version built against, CPU kernel ISA, NVTX ranges on/off, CUDA on/off, CUDA arch "
        "list, NCCL version");
  // mhc_sp.profiling.phase: Python phases as NVTX ranges in the ops' own "mhc_sp" domain, so a
  // timeline nests them with the ops' ranges on one row (and on CPU-only torch too).
  m.def(
      "nvtx_push", [](const std::string& message) { mhc_sp::nvtx_push(message.c_str()); },
      pybind11::arg("message"));
  m.def("nvtx_pop", [] { mhc_sp::nvtx_pop(); });

  // Group registry, driven by mhc_sp.distributed (init / destroy).
  m.def("register_group", &mhc_sp::register_group, pybind11::arg("name"), pybind11::arg("rank"),
        pybind11::arg("world"));
  m.def("unregister_all_groups", &mhc_sp::unregister_all_groups);
  m.def("group_rank_world", [](const std::string& name) {
    const auto g = mhc_sp::registered_group(name);
    return pybind11::make_tuple(g.rank, g.world);
  });
  m.def(
      "group_transport",
      [](const std::string& name, const std::string& device_type) {
        return mhc_sp::group_transport(name, c10::Device(device_type).type());
      },
      pybind11::arg("name"), pybind11::arg("device_type"));

  // Each transport's setup, driven by mhc_sp.distributed.init (csrc/transport/<name>/).
  mhc_sp::gloo::bind(m);
  mhc_sp::shm::bind(m);
  mhc_sp::symm::bind(m);
#if defined(MHC_SP_WITH_CUDA)
  mhc_sp::nccl::bind(m);
#endif
}
