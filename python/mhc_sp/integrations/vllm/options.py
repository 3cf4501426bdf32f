# SPDX-License-Identifier: Apache-2.0
"""The vLLM plugin's options and decisions, as plain Python (no torch, no vLLM): what
``additional_config={"mhc_sp": {...}}`` may hold, the checks that refuse it in one line, what the
plugin does for a given engine setup (on, or off with the one line that says why), and the
per-forward ``sharded`` decision.

The engine facts come in as an :class:`EngineFacts`, which the model module reads from vLLM's
``VllmConfig``; so everything here can be tested without vLLM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

#: The key of ``additional_config`` the plugin reads; without it the plugin does nothing.
CONFIG_KEY = "mhc_sp"

#: vLLM releases the plugin was run against end to end (scripts/vllm_e2e.sh); on any other
#: release it leaves vLLM as it is and says so.
TESTED_VLLM_VERSIONS = ("0.32.0",)

#: The architecture whose model class the plugin replaces.
ARCHITECTURE = "DeepseekV4ForCausalLM"

#: The largest threshold accepted (a larger one can never be reached: a typo), as the seed's
#: ``MAX_NUM_TOKENS`` bound in mhc_sp's own engine configuration.
MAX_SP_THRESHOLD = 2**31 - 1

#: The CPU transports the option ``transport`` takes (mhc_sp.distributed.init's names).
CPU_TRANSPORTS = ("auto", "shm", "gloo")

#: Every option, with its default (None: required).
OPTIONS: dict[str, Any] = {"sp_threshold": None, "transport": "auto", "timeout": None}


class OptionError(ValueError):
    """A bad ``additional_config["mhc_sp"]``: the message is one line that starts with the option's
    name as the user writes it (``additional_config.mhc_sp.<key>``)."""


def _where(key: str) -> str:
    return f"additional_config.{CONFIG_KEY}.{key}"


@dataclass(frozen=True)
class Options:
    """The checked options: ``sp_threshold`` (a forward of at least this many tokens, and at
    least tp, runs sharded), ``transport`` (``auto``, ``shm`` or ``gloo``: the TP group's
    transport for mhc_sp's ops), ``timeout`` (seconds a rank waits for its peers inside an op;
    None: the TP group's own timeout)."""

    sp_threshold: int
    transport: str = "auto"
    timeout: Optional[float] = None


def parse_options(additional_config: Any) -> Optional[Options]:
    """The plugin's options from vLLM's ``additional_config``, or None when it does not ask for
    the plugin (no ``"mhc_sp"`` key). Raises :class:`OptionError` (one line naming the option)
    for anything else that is wrong."""
    if additional_config is None:
        return None
    if not isinstance(additional_config, Mapping):
        # vLLM allows an object with compute_hash() here; it cannot carry mhc_sp's options.
        return None
    if CONFIG_KEY not in additional_config:
        return None
    raw = additional_config[CONFIG_KEY]
    if not isinstance(raw, Mapping):
        raise OptionError(
            f"additional_config.{CONFIG_KEY}: expected a dict of options "
            f"({', '.join(OPTIONS)}), got {type(raw).__name__}"
        )
    unknown = [k for k in raw if k not in OPTIONS]
    if unknown:
        key = unknown[0]
        raise OptionError(f"{_where(str(key))}: unknown option (known: {', '.join(OPTIONS)})")
    if "sp_threshold" not in raw or raw["sp_threshold"] is None:
        raise OptionError(
            f"{_where('sp_threshold')}: required, a positive integer (the token count from which "
            "a forward runs sharded)"
        )
    return Options(
        sp_threshold=_check_threshold(raw["sp_threshold"]),
        transport=_check_transport(raw.get("transport", OPTIONS["transport"])),
        timeout=_check_timeout(raw.get("timeout", OPTIONS["timeout"])),
    )


def _check_threshold(value: Any) -> int:
    where = _where("sp_threshold")
    if isinstance(value, bool) or not isinstance(value, int):
        # A string of digits as --additional-config's JSON may carry it is refused too: JSON has
        # integers, and "64" is more likely a quoting mistake than a wish.
        raise OptionError(f"{where}: expected a positive integer, got {value!r}")
    if value < 1:
        raise OptionError(f"{where}: expected a positive integer, got {value}")
    if value > MAX_SP_THRESHOLD:
        raise OptionError(
            f"{where}: {value} can never be reached (at most {MAX_SP_THRESHOLD} tokens)"
        )
    return value


def _check_transport(value: Any) -> str:
    where = _where("transport")
    if not isinstance(value, str) or value not in CPU_TRANSPORTS:
        raise OptionError(
            f"{where}: expected one of {', '.join(map(repr, CPU_TRANSPORTS))}, got {value!r}"
        )
    return value


def _check_timeout(value: Any) -> Optional[float]:
    where = _where("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OptionError(f"{where}: expected seconds (a positive number), got {value!r}")
    if not 0 < value < float("inf"):
        raise OptionError(f"{where}: expected seconds (a positive number), got {value!r}")
    return float(value)


def is_sharded(num_tokens: int, tp_size: int, sp_threshold: Optional[int]) -> bool:
    """The seed's decision for one forward (docs/design.md §3): sharded exactly when SP is on
    (a threshold and tp > 1), ``num_tokens >= sp_threshold`` and ``num_tokens >= tp_size``. Every
    rank calls it with the same arguments, once per forward, and every boundary of that forward
    uses the answer. (The same predicate as ``mhc_sp.engine.runner.plan.is_sharded``.)"""
    if sp_threshold is None or tp_size <= 1:
        return False
    return num_tokens >= sp_threshold and num_tokens >= tp_size


def release(version: str) -> str:
    """``0.32.0`` for ``0.32.0``, ``0.32.0+cpu`` or ``v0.32.0``: the release without a local
    suffix, which is what :data:`TESTED_VLLM_VERSIONS` lists."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    return m.group(1) if m else version.strip()


@dataclass(frozen=True)
class EngineFacts:
    """What the plugin needs to know of a vLLM engine's setup (read from its ``VllmConfig``)."""

    vllm_version: str
    platform: str  # "cpu", "cuda", "rocm", ...
    tensor_parallel_size: int
    pipeline_parallel_size: int = 1
    speculative: bool = False
    enforce_eager: bool = True


@dataclass(frozen=True)
class Decision:
    """What the plugin does for one engine: ``on`` with its ``options``, or off; ``message`` is
    the one line it logs (None: nothing to say, the plugin was not asked for), as a warning when
    ``refused`` (asked for what it cannot serve yet), else as information."""

    on: bool
    options: Optional[Options]
    message: Optional[str]
    refused: bool = False


def decide(additional_config: Any, facts: EngineFacts) -> Decision:
    """Whether the plugin takes over the DeepSeek-V4 model of this engine. Bad options raise
    :class:`OptionError`; a setup the plugin cannot serve yet gives ``on=False`` and the line
    that says so (vLLM then runs its own model, unchanged)."""
    options = parse_options(additional_config)
    if options is None:
        return Decision(False, None, None)

    def off(why: str) -> Decision:
        return Decision(
            False, options, f"mhc_sp: {why}; vLLM's own model runs unchanged", refused=True
        )

    if release(facts.vllm_version) not in TESTED_VLLM_VERSIONS:
        return off(
            f"not tested with vLLM {facts.vllm_version} (tested: {', '.join(TESTED_VLLM_VERSIONS)})"
        )
    if facts.platform != "cpu":
        return off(
            f"the {facts.platform} platform is not supported yet (the plugin serves vLLM's CPU "
            "DeepSeek-V4)"
        )
    if facts.pipeline_parallel_size > 1:
        return off(
            f"pipeline parallelism (pipeline_parallel_size={facts.pipeline_parallel_size})"
            " is not supported yet"
        )
    if facts.speculative:
        return off("speculative decoding (MTP/EAGLE draft models) is not supported yet")
    if not facts.enforce_eager:
        return off(
            "vLLM's compiled mode is not supported yet (its one trace for every token count "
            "would freeze the per-forward sharded decision); run with enforce_eager=True / "
            "--enforce-eager"
        )
    if facts.tensor_parallel_size <= 1:
        return Decision(
            False,
            options,
            "mhc_sp: tensor_parallel_size=1: nothing to shard (sequence parallelism needs tp > "
            "1); vLLM's own model runs unchanged",
        )
    return Decision(
        True,
        options,
        f"mhc_sp: on for DeepSeek-V4 (sp_threshold={options.sp_threshold}, "
        f"transport={options.transport}, tp={facts.tensor_parallel_size})",
    )
