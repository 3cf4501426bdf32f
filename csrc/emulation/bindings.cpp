// SPDX-License-Identifier: Apache-2.0
// mhc_sp._emulated: the CUDA device code run on the host (test-only, built with MHC_SP_TESTING=1
// on every machine, with or without nvcc). The math ops are the production entries (mhc_sp/ops.h)
// over the CUDA kernel table, on an emulated device whose memory is host memory (CPU tensors);
// World runs simulated symm ranks through the production op entries (emulation/world.h).
// docs/emulation.md: the model, what it proves and what only a GPU can.

#include <Python.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <map>

#include "emulation/device.h"
#include "emulation/internal.h"
#include "emulation/selftest.h"
#include "emulation/world.h"
#include "cuda/math_launch.cuh"
#include "mhc_sp/ops.h"
#include "mhc_sp/detail/python_errors.h"
#include "testing/symm_errors.h"
#include "testing/symm_sim_bindings.h"
#include "transport/symm/layout.h"

namespace py = pybind11;

namespace mhc_sp::emulation {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// The production plan of a pre-style op (cuda/math_launch.cuh) on the emulated device.
py::dict plan_pre(int64_t n, const std::string& mode, int64_t T, int64_t H) {
  TORCH_CHECK_VALUE(T >= 1 && H >= 1, "T, H: expected positive sizes, got ", T, ", ", H);
  cuda::PrePlan p{};
  int device = 0;
  cudaGetDevice(&device);
  const int sms = device_sms(device);
  dispatch_hc_mult(n, [&](auto n_const) {
    constexpr int N = decltype(n_const)::value;
    if (mode == "pre") {
      p = cuda::plan_pre<N, cuda::Mode::Pre>(T, H, sms);
    } else if (mode == "post_pre") {
      p = cuda::plan_pre<N, cuda::Mode::PostPre>(T, H, sms);
    } else if (mode == "broadcast") {
      p = cuda::plan_pre<N, cuda::Mode::Broadcast>(T, H, sms);
    } else if (mode == "head") {
      p = cuda::plan_pre<N, cuda::Mode::Head>(T, H, sms);
    } else {
      TORCH_CHECK_VALUE(false, "mode: expected pre, post_pre, broadcast or head, got '", mode, "'");
    }
  });
  py::dict d;
  d["tiles"] = p.tiles;
  d["splits"] = p.splits;
  d["per_split"] = p.per_split;
  d["items"] = p.items;
  d["fused"] = p.fused;
  return d;
}

template <typename... Ts>
std::vector<Tensor> tensors(const std::tuple<Ts...>& t) {
  return std::apply([](const auto&... x) { return std::vector<Tensor>{x...}; }, t);
}

// The schema arguments of the ops a World's ranks call, by name and in the order
// csrc/registration.cpp writes them (tests/repo/test_op_schemas.py checks this table against the
// registered schemas, so a call here reads each argument by its name, never by a position).
const std::map<std::string, std::vector<std::string>>& call_schemas() {
  static const std::map<std::string, std::vector<std::string>> schemas = {
      {"fused_layer",
       {"partial", "residual", "post", "comb", "fn", "hc_scale", "hc_base", "norm_weight", "group",
        "sharded", "num_tokens", "rms_eps", "hc_pre_eps", "hc_sinkhorn_eps", "hc_post_mult",
        "sinkhorn_iters", "norm_eps"}},
      {"fused_entry",
       {"x", "fn", "hc_scale", "hc_base", "norm_weight", "group", "sharded", "rms_eps",
        "hc_pre_eps", "hc_sinkhorn_eps", "hc_post_mult", "sinkhorn_iters", "norm_eps"}},
      {"fused_head",
       {"partial", "residual", "post", "comb", "head_fn", "head_scale", "head_base", "group",
        "sharded", "num_tokens", "rms_eps", "hc_eps"}},
      {"all_gather", {"x", "group", "num_tokens"}},
      {"reduce_scatter", {"x", "group"}},
      {"all_reduce", {"x", "group"}},
  };
  return schemas;
}

// A call's arguments as the schema's tuple, read by name.
struct SchemaArgs {
  const std::string& op;
  const std::vector<std::string>& names;
  const py::tuple& a;
  py::handle at(const char* name) const {
    const auto it = std::find(names.begin(), names.end(), name);
    TORCH_CHECK(it != names.end(), op, " has no argument '", name, "'");
    return a[static_cast<size_t>(it - names.begin())];
  }
  Tensor T(const char* name) const { return at(name).cast<Tensor>(); }
  OptTensor opt(const char* name) const { return at(name).cast<OptTensor>(); }
  int64_t I(const char* name) const { return at(name).cast<int64_t>(); }
  double D(const char* name) const { return at(name).cast<double>(); }
  bool B(const char* name) const { return at(name).cast<bool>(); }
};

// One rank's call: an op of mhc_sp/ops.h with the schema's arguments (its `group` ignored: the
// rank's own group is passed), converted now, under the GIL, and run later on the rank's thread.
World::Call rank_call(const std::string& op, const py::tuple& a) {
  const auto schema = call_schemas().find(op);
  TORCH_CHECK_VALUE(schema != call_schemas().end(),
                    "calls: expected fused_layer, fused_entry, fused_head, all_gather, "
                    "reduce_scatter or all_reduce, got '",
                    op, "'");
  const size_t n = schema->second.size();
  TORCH_CHECK_VALUE(a.size() == n, "calls: ", op, " takes ", n, " arguments (its schema's), got ",
                    a.size());
  const SchemaArgs s{op, schema->second, a};
  if (op == "fused_layer") {
    return [=, partial = s.T("partial"), residual = s.T("residual"), post = s.T("post"),
            comb = s.T("comb"), fn = s.T("fn"), scale = s.T("hc_scale"), base = s.T("hc_base"),
            norm_weight = s.opt("norm_weight"), sharded = s.B("sharded"),
            num_tokens = s.I("num_tokens"), rms_eps = s.D("rms_eps"), pre_eps = s.D("hc_pre_eps"),
            sinkhorn_eps = s.D("hc_sinkhorn_eps"), post_mult = s.D("hc_post_mult"),
            iters = s.I("sinkhorn_iters"), norm_eps = s.D("norm_eps")](const std::string& g) {
      return tensors(fused_layer(partial, residual, post, comb, fn, scale, base, norm_weight, g,
                                 sharded, num_tokens, rms_eps, pre_eps, sinkhorn_eps, post_mult,
                                 iters, norm_eps));
    };
  }
  if (op == "fused_entry") {
    return [=, x = s.T("x"), fn = s.T("fn"), scale = s.T("hc_scale"), base = s.T("hc_base"),
            norm_weight = s.opt("norm_weight"), sharded = s.B("sharded"), rms_eps = s.D("rms_eps"),
            pre_eps = s.D("hc_pre_eps"), sinkhorn_eps = s.D("hc_sinkhorn_eps"),
            post_mult = s.D("hc_post_mult"), iters = s.I("sinkhorn_iters"),
            norm_eps = s.D("norm_eps")](const std::string& g) {
      return tensors(fused_entry(x, fn, scale, base, norm_weight, g, sharded, rms_eps, pre_eps,
                                 sinkhorn_eps, post_mult, iters, norm_eps));
    };
  }
  if (op == "fused_head") {
    return [=, partial = s.T("partial"), residual = s.T("residual"), post = s.T("post"),
            comb = s.T("comb"), fn = s.T("head_fn"), scale = s.T("head_scale"),
            base = s.T("head_base"), sharded = s.B("sharded"), num_tokens = s.I("num_tokens"),
            rms_eps = s.D("rms_eps"), hc_eps = s.D("hc_eps")](const std::string& g) {
      return tensors(fused_head(partial, residual, post, comb, fn, scale, base, g, sharded,
                                num_tokens, rms_eps, hc_eps));
    };
  }
  if (op == "all_gather") {
    return [x = s.T("x"), num_tokens = s.I("num_tokens")](const std::string& g) {
      return std::vector<Tensor>{all_gather(x, g, num_tokens)};
    };
  }
  const bool scatter = op == "reduce_scatter";
  return [x = s.T("x"), scatter](const std::string& g) {
    return std::vector<Tensor>{scatter ? reduce_scatter(x, g) : all_reduce(x, g)};
  };
}

// The calls of every rank: a list per rank of (op, schema arguments), or None for a rank that
// never arrives.
using RankCalls = std::vector<std::optional<std::vector<std::pair<std::string, py::tuple>>>>;

std::vector<std::vector<World::Call>> rank_calls(const RankCalls& c) {
  std::vector<std::vector<World::Call>> calls;
  for (const auto& rank : c) {
    calls.emplace_back();
    if (!rank) continue;
    for (const auto& [op, args] : *rank) calls.back().push_back(rank_call(op, args));
  }
  return calls;
}

py::object error_object(const World::Outcome& o) {
  return py::module_::import("builtins")
      .attr(o.value_error ? "ValueError" : "RuntimeError")(o.error);
}

// One result per rank: None (no calls), the exception that stopped it, or its outputs (a tuple
// per call when `sequences`, else the one call's tuple).
py::list results(const RankCalls& c, const std::vector<World::Outcome>& out, bool sequences) {
  py::list result;
  for (size_t r = 0; r < out.size(); ++r) {
    if (!c[r]) {
      result.append(py::none());
    } else if (!out[r].error.empty()) {
      result.append(error_object(out[r]));
    } else if (sequences) {
      py::list calls;
      for (const auto& o : out[r].outputs) calls.append(py::tuple(py::cast(o)));
      result.append(calls);
    } else {
      result.append(py::tuple(py::cast(out[r].outputs.at(0))));
    }
  }
  return result;
}

py::list run_world(World& w, const std::vector<std::optional<std::pair<std::string, py::tuple>>>& c,
                   const std::vector<double>& delays_s) {
  RankCalls seqs;
  for (const auto& item : c) {
    seqs.push_back(item ? std::optional(std::vector{*item}) : std::nullopt);
  }
  const auto calls = rank_calls(seqs);
  std::vector<World::Outcome> out;
  {
    const py::gil_scoped_release release;
    out = w.run(calls, delays_s);
  }
  return results(seqs, out, false);
}

py::list run_sequences(World& w, const RankCalls& c, const std::vector<double>& delays_s,
                       const std::vector<int64_t>& pauses_us) {
  const auto calls = rank_calls(c);
  std::vector<World::Outcome> out;
  {
    const py::gil_scoped_release release;
    out = w.run(calls, delays_s, pauses_us);
  }
  return results(c, out, true);
}

py::tuple capture_world(World& w, const RankCalls& c) {
  const auto calls = rank_calls(c);
  std::vector<World::Outcome> out;
  std::vector<std::shared_ptr<Graph>> graphs;
  {
    const py::gil_scoped_release release;
    graphs = w.capture(calls, out);
  }
  return py::make_tuple(graphs, results(c, out, true));
}

py::list replay_world(World& w, const std::vector<std::shared_ptr<Graph>>& graphs) {
  std::vector<std::string> errors;
  {
    const py::gil_scoped_release release;
    errors = w.replay(graphs);
  }
  py::list out;
  for (const std::string& e : errors) {
    out.append(e.empty() ? py::none() : py::module_::import("builtins").attr("RuntimeError")(e));
  }
  return out;
}

void bind(py::module_& m) {
  m.def(
      "configure",
      [](int sms, int blocks_per_sm, uint64_t seed, double launch_timeout_s,
         const std::string& schedule, bool racecheck, bool delays) {
        configure(DeviceConfig{sms, blocks_per_sm, seed, launch_timeout_s, schedule_named(schedule),
                               racecheck, delays});
      },
      py::arg("sms") = 4, py::arg("blocks_per_sm") = 2, py::arg("seed") = 1,
      py::arg("launch_timeout_s") = 120.0, py::arg("schedule") = "mixed",
      py::arg("racecheck") = true, py::arg("delays") = true,
      "Sets every emulated device: SMs, resident blocks per SM (the occupancy every kernel "
      "gets), the seed of the schedules and delays, the launch timeout, how a block's threads "
      "are scheduled (mixed: each block draws random, warp_ahead, warp_behind or in_order), the "
      "shared-memory racecheck, and the random delays at stores, polls and calls.");
  m.def("configure_device", &configure_device, py::arg("device"), py::arg("sms"),
        py::arg("blocks_per_sm"), py::arg("lag_us") = 0,
        "Gives one emulated device another size (until the next configure()); lag_us > 0 makes "
        "it a lagging rank: each block stalls that long once it has stored to system memory (an "
        "arrival, a push) and polled for its peers, so its peers run into their next call.");
  m.def("config", [] {
    const DeviceConfig c = config();
    py::dict d;
    d["sms"] = c.sms;
    d["blocks_per_sm"] = c.blocks_per_sm;
    d["seed"] = c.seed;
    d["launch_timeout_s"] = c.launch_timeout_s;
    d["schedule"] = schedule_name(c.schedule);
    d["racecheck"] = c.racecheck;
    d["delays"] = c.delays;
    return d;
  });
  m.def("call_schemas", &call_schemas,
        "The argument names World reads each op's calls by, in the order of its schema.");
  m.def(
      "launches",
      [] {
        py::list out;
        for (const LaunchRecord& r : launches()) {
          out.append(py::make_tuple(r.grid_x, r.grid_y, r.block_x, r.cooperative));
        }
        return out;
      },
      "(grid x, grid y, threads, cooperative) of every launch since reset_launches()");
  m.def(
      "timeline",
      [] {
        py::list out;
        for (const LaunchRecord& r : launches()) {
          py::dict d;
          d["device"] = r.device;
          d["grid"] = r.grid_x;
          d["dependent"] = r.dependent;
          d["start_ns"] = r.start_ns;
          d["end_ns"] = r.end_ns;
          out.append(d);
        }
        return out;
      },
      "Every launch since reset_launches(): its device, grid, whether it was a programmatic "
      "dependent, and when it started and completed (steady clock, ns)");
  // False in the sanitizer builds (scripts/sanitize.sh), which leave out access_hooks.cpp.
  m.attr("access_checks") = py::bool_(MHC_SP_EMULATION_ACCESS_HOOKS != 0);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  m.attr("sanitized") = true;  // what the compiler was told, against the build's own choice above
#else
  m.attr("sanitized") = false;
#endif
  m.def(
      "shared_variables", [] { return detail::shared_variables(); },
      "(name, bytes) of every __shared__ variable the racecheck watches");
  m.def("reset_launches", &reset_launches);
  m.def(
      "events",
      [] {
        py::list out;
        for (const EventRecord& e : events()) out.append(py::make_tuple(e.device, e.what, e.event));
        return out;
      },
      "(device, 'wait' or 'record', event id) of every event operation since reset_events()");
  m.def("reset_events", &reset_events);
  m.def("plan_pre", &plan_pre, py::arg("n"), py::arg("mode"), py::arg("T"), py::arg("H"));

  // The math ops: the production entries on the emulated device (schema arguments, CPU tensors).
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("mhc_pre", &mhc_pre, nogil);
  m.def("mhc_post", &mhc_post, nogil);
  m.def("mhc_post_pre", &mhc_post_pre, nogil);
  m.def("mhc_pre_broadcast", &mhc_pre_broadcast, nogil);
  m.def("hc_head", &hc_head, nogil);

  // Checks of the emulated device itself (emulation/selftest.h).
  m.def("selftest_shfl", &selftest_shfl, py::arg("lane_mask"), nogil);
  m.def("selftest_neighbours", &selftest_neighbours, py::arg("threads"), py::arg("barrier"), nogil);
  m.def("selftest_divergent_barrier", &selftest_divergent_barrier, nogil);
  m.def("selftest_partial_warp", &selftest_partial_warp, nogil);
  m.def("selftest_mma", &selftest_mma, py::arg("a"), py::arg("b"), nogil);
  m.def("selftest_cross_warp", &selftest_cross_warp, py::arg("barrier"), nogil);
  m.def("selftest_same_warp", &selftest_same_warp, nogil);
  m.def("selftest_fresh_flag", &selftest_fresh_flag, py::arg("blocks"), nogil);
  m.def("selftest_poll", &selftest_poll, py::arg("weak"), nogil);
  m.def("selftest_gpu_scope_store", &selftest_gpu_scope_store, py::arg("host_mapped"), nogil);
  m.def("selftest_unknown_ptx", &selftest_unknown_ptx, nogil);
  m.def("selftest_pdl", &selftest_pdl, py::arg("n"), py::arg("wait"), nogil);
  m.def("selftest_chain", &selftest_chain, py::arg("blocks"), py::arg("wait_for_later"),
        py::arg("cooperative") = false, nogil);

  py::class_<Graph, std::shared_ptr<Graph>>(m, "Graph", "A captured stream of an emulated device");
  py::class_<World>(m, "World", "Simulated symm ranks on emulated devices")
      .def(py::init<int64_t, int64_t, int64_t, double, std::vector<int64_t>>(), py::arg("world"),
           py::arg("mailbox_slot_bytes"), py::arg("half_bytes"), py::arg("timeout_s"),
           py::arg("devices") = std::vector<int64_t>{})
      .def_property_readonly("size", &World::size)
      .def("group", &World::group, py::arg("rank"))
      .def("run", &run_world, py::arg("calls"), py::arg("delays_s") = std::vector<double>{},
           "calls[r]: (op, schema arguments) for rank r, or None for a rank that never "
           "arrives. One result per rank: its outputs, the exception its call raised, or None.")
      .def("run_sequences", &run_sequences, py::arg("calls"),
           py::arg("delays_s") = std::vector<double>{},
           py::arg("pauses_us") = std::vector<int64_t>{},
           "calls[r]: a list of (op, schema arguments) that rank r makes one after another with "
           "no join between calls, or None; pauses_us[r]: the most a seeded random pause before "
           "each of rank r's calls lasts. One result per rank: a list of output tuples, the "
           "exception that stopped it, or None.")
      .def("call_spans", &World::call_spans,
           "(start, end) of every call of the last run, per rank (the clock of timeline())")
      .def("capture", &capture_world, py::arg("calls"),
           "Captures every rank's list of calls as a graph on its device (nothing runs): "
           "(graphs, the outputs each call will write).")
      .def("replay", &replay_world, py::arg("graphs"),
           "Replays every rank's graph at once: None per rank, or the error it raised.")
      .def(
          "local_states",
          [](const World& w) {
            py::list out;
            for (int64_t r = 0; r < w.size(); ++r) {
              const symm::LocalState s = w.workspace(r).local_state();
              py::dict d;
              d["lamport_calls"] = s.lamport_calls;
              d["exchange_calls"] = s.exchange_calls;
              d["lamport_done"] = s.lamport_done;
              d["exchange_done"] = s.exchange_done;
              d["tile_counter"] = s.tile_counter;
              out.append(d);
            }
            return out;
          },
          "Every rank's device counters after the last run: calls done per path, the arrival "
          "counts and the decode tile counter (zero between calls).")
      .def("errors",
           [](const World& w) {
             py::list out;
             for (int64_t r = 0; r < w.size(); ++r)
               out.append(testing::error_dict(w.workspace(r).error()));
             return out;
           })
      .def(
          "describe_error",
          [](const World& w, int64_t rank) {
            const symm::ErrorRecord e = w.workspace(rank).error();
            return e.code == symm::kNoError
                       ? std::string()
                       : symm::describe_error(e, w.group(rank), w.workspace(rank).timeout_s());
          },
          py::arg("rank"));
  // The GPU harness's simulated ranks (testing/symm_sim.h), their kernels on an emulated device.
  testing::bind_symm_sim(m);
}

}  // namespace
}  // namespace mhc_sp::emulation

PYBIND11_MODULE(_emulated, m) {
  m.doc() = "mhc_sp's CUDA device code run on the host (an emulated device), for the tests";
  mhc_sp::register_error_translator();
  mhc_sp::emulation::bind(m);
}
