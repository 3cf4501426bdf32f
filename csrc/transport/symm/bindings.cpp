// SPDX-License-Identifier: Apache-2.0
// mhc_sp._C bindings of the symm transport: the constants and buffer layout its setup needs (every
// build), and, in CUDA builds, the peer-link query and the transport's setup, both driven by
// mhc_sp.distributed.init through python/mhc_sp/transports/symm.py. What only tests use (the host
// arithmetic, the simulated ranks) is in the testing module (csrc/testing/).

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "transport/symm/layout.h"
#include "transport/symm/transport.h"

#if defined(MHC_SP_WITH_CUDA)
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include "transport/nccl/transport.h"
#include "transport/symm/communicator.h"
#endif

namespace py = pybind11;

namespace mhc_sp::symm {
namespace {

py::dict layout_dict(const BufferLayout& L) {
  py::dict d;
  d["world"] = L.world;
  d["flags_offset"] = L.flags_offset;
  d["mailbox_offset"] = L.mailbox_offset;
  d["mailbox_slot_bytes"] = L.mailbox_slot_bytes;
  d["halves_offset"] = L.halves_offset;
  d["half_bytes"] = L.half_bytes;
  d["total_bytes"] = L.total_bytes;
  return d;
}

#if defined(MHC_SP_WITH_CUDA)

// Keeps a Python object (the rendezvous handle that maps the peers' buffers) alive for the
// workspace, and releases it with the GIL, from whichever thread drops the last reference. After
// the interpreter has gone there is nothing to release it into: it is left as it is.
std::shared_ptr<const void> python_owner(py::object obj) {
  auto* held = new py::object(std::move(obj));
  return std::shared_ptr<const void>(held, [](const void* p) {
    auto* o = static_cast<py::object*>(const_cast<void*>(p));
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      delete o;
    } else {
      o->release();
      delete o;
    }
  });
}

py::dict peer_link(int64_t device, int64_t peer) {
  const int64_t devices = c10::cuda::device_count();
  TORCH_CHECK_VALUE(device >= 0 && device < devices, "device: expected [0, ", devices, "), got ",
                    device);
  TORCH_CHECK_VALUE(peer >= 0 && peer < devices, "peer: expected [0, ", devices, "), got ", peer);
  py::dict d;
  if (device == peer) {  // a device reaches its own memory, atomics included
    d["access"] = true;
    d["native_atomics"] = true;
    return d;
  }
  int access = 0, atomics = 0;
  C10_CUDA_CHECK(cudaDeviceGetP2PAttribute(&access, cudaDevP2PAttrAccessSupported,
                                           static_cast<int>(device), static_cast<int>(peer)));
  C10_CUDA_CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported,
                                           static_cast<int>(device), static_cast<int>(peer)));
  d["access"] = access != 0;
  d["native_atomics"] = atomics != 0;
  return d;
}

#endif  // MHC_SP_WITH_CUDA

}  // namespace

void bind(py::module_& m) {
  m.def("symm_constants", [] {
    py::dict d;
    d["max_world"] = kMaxRanks;
    d["max_blocks"] = kMaxBlocks;
    d["mailboxes"] = kMailboxes;
    d["lamport_max_tokens"] = kLamportMaxTokens;
    d["default_mailbox_slot_bytes"] = kDefaultMailboxSlotBytes;
    d["default_half_bytes"] = kDefaultHalfBytes;
    d["local_state_bytes"] = static_cast<int64_t>(sizeof(LocalState));
    return d;
  });
  m.def(
      "symm_buffer_layout",
      [](int64_t world, int64_t mailbox_slot_bytes, int64_t half_bytes) {
        return layout_dict(checked_buffer_layout(world, mailbox_slot_bytes, half_bytes));
      },
      py::arg("world"), py::arg("mailbox_slot_bytes"), py::arg("half_bytes"));

#if defined(MHC_SP_WITH_CUDA)
  m.def("cuda_peer_link", &peer_link, py::arg("device"), py::arg("peer"));
  // `mapping`: the rendezvous handle that keeps the peers' buffers mapped (the workspace owns it).
  m.def(
      "init_symm_transport",
      [](const std::string& name, std::optional<py::bytes> unique_id, int64_t device, Tensor buffer,
         const std::vector<int64_t>& peer_ptrs, int64_t mailbox_slot_bytes, int64_t half_bytes,
         double timeout_s, py::object mapping) {
        const GroupHandle g = registered_group(name);
        const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        auto ws = std::make_unique<SymmWorkspace>(buffer, peer_ptrs, g.rank, g.world,
                                                  mailbox_slot_bytes, half_bytes, timeout_s,
                                                  python_owner(std::move(mapping)));
        std::shared_ptr<Communicator> fallback;  // none: ranks share a GPU, which NCCL refuses
        if (unique_id) {
          const std::string id = *unique_id;
          py::gil_scoped_release no_gil;  // blocks until every rank joins
          fallback = nccl::make_communicator(name, id, device);
        }
        attach_communicator(
            name, c10::DeviceType::CUDA, device,
            std::make_shared<SymmCommunicator>(name, std::move(ws), std::move(fallback)));
      },
      py::arg("name"), py::arg("unique_id"), py::arg("device"), py::arg("buffer"),
      py::arg("peer_ptrs"), py::arg("mailbox_slot_bytes"), py::arg("half_bytes"),
      py::arg("timeout_s"), py::arg("mapping"));
#endif
}

}  // namespace mhc_sp::symm
