# SPDX-License-Identifier: Apache-2.0
"""``EngineArgs``: the one way command-line flags become an :class:`EngineConfig`.

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    engine = EngineArgs.from_cli_args(parser.parse_args()).create_engine_config()

Each flag is defined once here, in its field's metadata (:func:`_flag`), named as serving engines
name it (``--tensor-parallel-size`` / ``-tp``, ``--sp-threshold``, ``--enforce-eager``...). A flag
whose value can never be valid (``--sp-threshold 0``, a negative size, text) is an argparse error
naming the flag; rules that involve several values are checked by
:meth:`EngineArgs.create_engine_config`.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from .arg_types import non_negative_int, optional_token_count, positive_int
from .compilation import CompilationConfig
from .engine import EngineConfig
from .model import ModelConfig
from .moe import MOE_BACKEND_SUPPORTS_SP
from .parallel import ParallelConfig


def default_num_heads(hidden_size: int) -> int:
    """Heads of width 64 from hidden 1024 up (V4's scale), of width 8 below (test sizes)."""
    return max(1, hidden_size // (64 if hidden_size >= 1024 else 8))


#: The groups the flags are shown in, in the help's order.
_PARALLELISM = "parallelism"
_EXECUTION = "execution"
_MODEL_SIZE = "model size (the small test model unless given)"
_GROUPS = (_PARALLELISM, _EXECUTION, _MODEL_SIZE)


@dataclass(frozen=True)
class _Flag:
    """How one EngineArgs field is a command-line flag (its ``metadata["flag"]``)."""

    group: str
    names: tuple[str, ...]
    help: str
    #: The rest of ``add_argument``'s keywords: type, metavar, choices or action.
    argparse_kwargs: Mapping[str, Any]
    #: What a field left None becomes, for the help text; None: the ``model_field`` of ``tiny``.
    unset: Optional[str]
    #: The :class:`ModelConfig` field this one sets (None for the engine's own fields).
    model_field: Optional[str]

    def shown_default(self, value: Any, tiny: ModelConfig) -> Any:
        """The default the help shows for a flag whose default is ``value``."""
        if value is not None:
            return value
        if self.unset is None and self.model_field is not None:
            return getattr(tiny, self.model_field)
        return self.unset


def _flag(
    default: Any,
    group: str,
    *names: str,
    help: str,
    unset: Optional[str] = None,
    model_field: Optional[str] = None,
    **argparse_kwargs: Any,
) -> Any:
    """An EngineArgs field with its flag: ``names`` in ``group``, shown with ``help``."""
    flag = _Flag(group, names, help, argparse_kwargs, unset, model_field)
    return dataclasses.field(default=default, metadata={"flag": flag})


def _model_size(
    name: str, metavar: str, model_field: str, help: str, unset: Optional[str] = None
) -> Any:
    """A model size: a positive integer setting ``model_field``, None (the ``tiny`` preset's
    value, or ``unset``) unless given."""
    return _flag(
        None,
        _MODEL_SIZE,
        name,
        type=positive_int,
        metavar=metavar,
        model_field=model_field,
        unset=unset,
        help=help,
    )


@dataclass
class EngineArgs:
    """Engine settings as flat fields, one per flag, in the help's order. Model fields left None
    take the ``tiny`` preset's value (``num_heads`` and ``moe_intermediate_size`` follow
    ``hidden_size`` when only that is given)."""

    tensor_parallel_size: int = _flag(
        1,
        _PARALLELISM,
        "--tensor-parallel-size",
        "-tp",
        type=positive_int,
        metavar="N",
        help="ranks each layer's weights are split over",
    )
    pipeline_parallel_size: int = _flag(
        1,
        _PARALLELISM,
        "--pipeline-parallel-size",
        "-pp",
        type=positive_int,
        metavar="N",
        help="pipeline stages the layers are split into",
    )
    sp_threshold: Optional[int] = _flag(
        None,
        _PARALLELISM,
        "--sp-threshold",
        type=optional_token_count,
        metavar="N",
        unset="off",
        help="sequence parallelism: forwards of at least N tokens keep the mHC residual "
        "stream split by tokens over the tensor-parallel ranks (needs -tp > 1; None: "
        "off; `mhc-sp-bench tune` measures a good N for this machine)",
    )
    enforce_eager: bool = _flag(
        False,
        _EXECUTION,
        "--enforce-eager",
        action="store_true",
        help="run every forward eagerly: no CUDA graphs and no compile pass",
    )
    max_cudagraph_capture_size: int = _flag(
        0,
        _EXECUTION,
        "--max-cudagraph-capture-size",
        type=non_negative_int,
        metavar="N",
        help="capture CUDA graphs for forwards of up to N tokens (CUDA only; 0: none; "
        "--sp-threshold must be above it)",
    )
    num_speculative_tokens: int = _flag(
        0,
        _EXECUTION,
        "--num-speculative-tokens",
        type=non_negative_int,
        metavar="K",
        help="MTP draft steps after each forward, each fed the previous step's stream",
    )
    hidden_size: Optional[int] = _model_size("--hidden-size", "H", "hidden_size", "hidden size")
    num_layers: Optional[int] = _model_size("--num-layers", "L", "num_layers", "decoder layers")
    num_heads: Optional[int] = _model_size(
        "--num-heads",
        "N",
        "num_heads",
        "attention heads",
        unset="hidden/64 from 1024 up, else hidden/8",
    )
    num_experts: Optional[int] = _model_size(
        "--num-experts", "E", "num_routed_experts", "routed experts per MoE layer"
    )
    num_experts_per_tok: Optional[int] = _model_size(
        "--num-experts-per-tok", "K", "num_experts_per_tok", "experts each token is routed to"
    )
    moe_intermediate_size: Optional[int] = _model_size(
        "--moe-intermediate-size",
        "I",
        "moe_intermediate_size",
        "intermediate size of each expert",
        unset="hidden/2",
    )
    vocab_size: Optional[int] = _model_size("--vocab-size", "V", "vocab_size", "vocabulary size")
    moe_backend: str = _flag(
        "naive",
        _MODEL_SIZE,
        "--moe-backend",
        choices=sorted(MOE_BACKEND_SUPPORTS_SP),
        help="MoE implementation: naive computes every routed token; capacity drops "
        "tokens beyond each expert's capacity and cannot run with "
        "--sp-threshold",
    )
    seed: int = _flag(
        0, _MODEL_SIZE, "--seed", type=non_negative_int, help="seed of the synthetic weights"
    )

    @staticmethod
    def add_cli_args(
        parser: argparse.ArgumentParser,
        only: Optional[Iterable[str]] = None,
        defaults: Optional[Mapping[str, Any]] = None,
    ) -> argparse.ArgumentParser:
        """Add the engine flags to ``parser``: all of them, or the fields named in ``only``
        (a tool that needs a few of them, spelled as the engine spells them). ``defaults``
        overrides field defaults for this parser (the help shows them). Returns the parser."""
        names = {f.name for f in dataclasses.fields(EngineArgs)}
        wanted = names if only is None else set(only)
        defaults = dict(defaults or {})
        for arg, given in (("only", wanted), ("defaults", set(defaults))):
            if given - names:
                raise ValueError(f"{arg}: unknown EngineArgs fields {sorted(given - names)}")
        values = {**dataclasses.asdict(EngineArgs()), **defaults}
        tiny = ModelConfig.tiny()
        groups = {title: parser.add_argument_group(title) for title in _GROUPS}
        for f in dataclasses.fields(EngineArgs):
            if f.name not in wanted:
                continue
            flag, value = f.metadata["flag"], values[f.name]
            help = flag.help
            if not flag.argparse_kwargs.get("action"):  # a switch's help shows no default
                help = f"{help} (default: {flag.shown_default(value, tiny)})"
            groups[flag.group].add_argument(
                *flag.names, dest=f.name, default=value, help=help, **flag.argparse_kwargs
            )
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        """The EngineArgs of parsed flags; fields whose flag was not added keep their default."""
        return cls(
            **{
                f.name: getattr(args, f.name)
                for f in dataclasses.fields(cls)
                if hasattr(args, f.name)
            }
        )

    def create_model_config(self) -> ModelConfig:
        """The ``tiny`` preset with the given sizes applied."""
        changes = {
            f.metadata["flag"].model_field: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.metadata["flag"].model_field is not None and getattr(self, f.name) is not None
        }
        if self.hidden_size is not None:
            changes.setdefault("num_heads", default_num_heads(self.hidden_size))
            changes.setdefault("moe_intermediate_size", max(1, self.hidden_size // 2))
        return ModelConfig.tiny(seed=self.seed, **changes)

    def create_engine_config(self, world_size: Optional[int] = None) -> EngineConfig:
        """The validated :class:`EngineConfig`. ``world_size``: ranks actually started (e.g. by
        torchrun); it must equal tensor x pipeline parallel size. Raises ValueError (or
        NotImplementedError for a MoE backend SP cannot use) naming the offending values."""
        parallel = ParallelConfig(
            self.tensor_parallel_size,
            self.pipeline_parallel_size,
            self.sp_threshold,
        )
        if world_size is not None and world_size != parallel.world_size:
            raise ValueError(
                f"tensor_parallel_size={parallel.tensor_parallel_size} x "
                f"pipeline_parallel_size={parallel.pipeline_parallel_size} needs "
                f"{parallel.world_size} ranks, but the world has {world_size}"
            )
        return EngineConfig(
            model=self.create_model_config(),
            parallel=parallel,
            compilation=CompilationConfig(
                max_cudagraph_capture_size=self.max_cudagraph_capture_size
            ),
            enforce_eager=self.enforce_eager,
            moe_backend=self.moe_backend,
            num_speculative_tokens=self.num_speculative_tokens,
        )
