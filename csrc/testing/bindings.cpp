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

#include "testing/symm_args.h"

#if defined(MHC_SP_WITH_CUDA)
#include "testing/symm_sim_bindings.h"
#endif

namespace py = pybind11;

namespace mhc_sp::testing {
namespace {

using namespace ::mhc_sp::symm;  // the host arithmetic under test

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
  bind_symm_sim(m);
#endif
}

}  // namespace
}  // namespace mhc_sp::testing

PYBIND11_MODULE(_testing, m) {
  m.doc() = "mhc_sp test-only machinery: symm host arithmetic, the single-GPU symm harness";
  mhc_sp::register_error_translator();
  mhc_sp::testing::bind(m);
}
