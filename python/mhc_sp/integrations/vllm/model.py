# SPDX-License-Identifier: Apache-2.0
"""vLLM's CPU DeepSeek-V4 with its mHC boundaries on mhc_sp (imported by vLLM's model registry,
never by :func:`mhc_sp.integrations.vllm.register` itself).

:class:`MhcSpDeepseekV4ForCausalLM` subclasses the platform's ``DeepseekV4ForCausalLM`` and keeps
everything of it (weights, loader, attention, MoE, KV cache, LM head, sampler) but the forward of
the residual stream. When vLLM builds it:

* without ``additional_config["mhc_sp"]`` it builds vLLM's own class instead (the model is then
  exactly vLLM's); bad options raise :class:`~.options.OptionError` (one line naming the option);
  a setup the plugin cannot serve yet (another platform, pipeline parallelism, speculative
  decoding, compiled mode, tp = 1, an untested vLLM) builds vLLM's own class and logs one line;
* otherwise every attention's ``wo_b`` and every MoE stop all-reducing (they return this rank's
  un-reduced partial), and the forward runs the stream through :class:`~.boundaries.Boundaries`:
  ``fused_entry`` after the embedding, ``fused_layer`` after each attention and each MoE (the
  MoE's reduction becomes the next layer's first boundary), ``fused_head`` before the final norm;
  each sublayer's RMSNorm is fused into the boundary before it.
"""

from __future__ import annotations

import logging
from itertools import islice

import torch
from vllm.distributed import get_pp_group, get_tp_group
from vllm.models.deepseek_v4 import DeepseekV4ForCausalLM as _VllmDeepseekV4ForCausalLM

from ...config import MhcConfig
from .boundaries import Boundaries
from .options import EngineFacts, decide

logger = logging.getLogger("vllm.mhc_sp")

#: The lines this process has logged (each said once per process).
_said: set = set()


def _say(message: str, level: int = logging.INFO) -> None:
    if message not in _said:
        _said.add(message)
        logger.log(level, message)


def engine_facts(vllm_config) -> EngineFacts:
    """The :class:`EngineFacts` of a ``VllmConfig``."""
    import vllm
    from vllm.config import CompilationMode
    from vllm.platforms import current_platform

    parallel = vllm_config.parallel_config
    return EngineFacts(
        vllm_version=str(vllm.__version__),
        platform=str(current_platform.device_type or current_platform.device_name),
        tensor_parallel_size=parallel.tensor_parallel_size,
        pipeline_parallel_size=parallel.pipeline_parallel_size,
        speculative=vllm_config.speculative_config is not None,
        enforce_eager=vllm_config.compilation_config.mode == CompilationMode.NONE,
    )


def mhc_config(hf_config) -> MhcConfig:
    """The model's mHC constants, as vLLM's CPU layer passes them to its kernels: ``hc_eps`` for
    the pre, Sinkhorn and head epsilons, ``rms_norm_eps`` for the mHC and sublayer norms, post
    multiplier 2."""
    hc_eps, rms_eps = float(hf_config.hc_eps), float(hf_config.rms_norm_eps)
    return MhcConfig(
        hc_mult=int(hf_config.hc_mult),
        sinkhorn_iters=int(hf_config.hc_sinkhorn_iters),
        hc_pre_eps=hc_eps,
        hc_sinkhorn_eps=hc_eps,
        hc_post_mult=2.0,
        rms_eps=rms_eps,
        norm_eps=rms_eps,
        hc_eps=hc_eps,
    )


def _unreduce_moe(ffn: torch.nn.Module) -> None:
    """Make a DeepSeek-V4 MoE return this rank's un-reduced partial (routed plus shared experts):
    its ``moe_config.skip_final_all_reduce``, read on every forward, as vLLM sets it for a MoE
    built with ``reduce_results=False``."""
    configs = []
    for module in ffn.modules():
        for owner in (module, getattr(module, "runner", None)):
            config = getattr(owner, "moe_config", None)
            if config is not None and hasattr(config, "skip_final_all_reduce"):
                if all(config is not c for c in configs):
                    configs.append(config)
    if not configs:
        raise RuntimeError(
            "mhc_sp: this vLLM's DeepSeek-V4 MoE has no moe_config.skip_final_all_reduce; the "
            "plugin cannot take its reduction over"
        )
    for config in configs:
        config.skip_final_all_reduce = True


class MhcSpDeepseekV4ForCausalLM(_VllmDeepseekV4ForCausalLM):
    """vLLM's ``DeepseekV4ForCausalLM`` with each mHC boundary one mhc_sp op (module docstring)."""

    def __new__(cls, *args, vllm_config=None, prefix: str = "", **kwargs):
        if vllm_config is None:  # not vLLM building it (e.g. introspection): as the base does
            return super().__new__(cls)
        decision = decide(vllm_config.additional_config, engine_facts(vllm_config))
        if decision.message is not None:
            _say(decision.message, logging.WARNING if decision.refused else logging.INFO)
        if not decision.on:
            return _VllmDeepseekV4ForCausalLM(vllm_config=vllm_config, prefix=prefix, **kwargs)
        return super().__new__(cls)

    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        decision = decide(vllm_config.additional_config, engine_facts(vllm_config))
        assert decision.on and decision.options is not None
        model = self.model
        self._mhc_layers = list(islice(model.layers, model.start_layer, model.end_layer))
        for layer in self._mhc_layers:
            layer.attn.wo_b.reduce_results = False
            _unreduce_moe(layer.ffn)
        tp = get_tp_group()
        self.mhc_sp = Boundaries(
            tp.cpu_group,
            tp.rank_in_group,
            tp.world_size,
            decision.options,
            mhc_config(self.config),
        )
        _say(f"mhc_sp: TP group transport {self.mhc_sp.transport}")
        assert get_pp_group().world_size == 1

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        model, b, layers = self.model, self.mhc_sp, self._mhc_layers
        x = inputs_embeds if inputs_embeds is not None else model.embed_input_ids(input_ids)
        b.begin(x.shape[0])
        first = layers[0]
        residual, post, comb, h = b.entry(
            x, first.hc_attn_fn, first.hc_attn_scale, first.hc_attn_base, first.attn_norm.weight
        )
        for i, layer in enumerate(layers):
            partial = layer.attn(positions, h, None)
            residual, post, comb, h = b.layer(
                partial,
                residual,
                post,
                comb,
                layer.hc_ffn_fn,
                layer.hc_ffn_scale,
                layer.hc_ffn_base,
                layer.ffn_norm.weight,
            )
            partial = layer.ffn(h, input_ids)
            if i + 1 < len(layers):
                nxt = layers[i + 1]
                residual, post, comb, h = b.layer(
                    partial,
                    residual,
                    post,
                    comb,
                    nxt.hc_attn_fn,
                    nxt.hc_attn_scale,
                    nxt.hc_attn_base,
                    nxt.attn_norm.weight,
                )
        hidden = b.head(
            partial, residual, post, comb, model.hc_head_fn, model.hc_head_scale, model.hc_head_base
        )
        b.end()
        return model.norm(hidden)
