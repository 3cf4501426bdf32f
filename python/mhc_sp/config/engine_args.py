# SPDX-License-Identifier: Apache-2.0
"""``EngineArgs``: the one way command-line flags become an :class:`EngineConfig`.

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    engine = EngineArgs.from_cli_args(parser.parse_args()).create_engine_config()

Each flag is defined once here, named as serving engines name it (``--tensor-parallel-size`` /
``-tp``, ``--sp-threshold``, ``--enforce-eager``...). A flag whose value can never be valid
(``--sp-threshold 0``, a negative size, text) is an argparse error naming the flag; rules that
involve several values are checked by :meth:`EngineArgs.create_engine_config`.
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


@dataclass
class EngineArgs:
    """Engine settings as flat fields, one per flag. Model fields left None take the ``tiny``
    preset's value (``num_heads`` and ``moe_intermediate_size`` follow ``hidden_size`` when only
    that is given)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    sp_threshold: Optional[int] = None
    enforce_eager: bool = False
    max_cudagraph_capture_size: int = 0
    moe_backend: str = "naive"
    num_speculative_tokens: int = 0
    hidden_size: Optional[int] = None
    num_layers: Optional[int] = None
    num_heads: Optional[int] = None
    num_experts: Optional[int] = None
    num_experts_per_tok: Optional[int] = None
    moe_intermediate_size: Optional[int] = None
    vocab_size: Optional[int] = None
    seed: int = 0

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
        # What a model field left unset becomes, for the help text.
        unset = {
            "hidden_size": tiny.hidden_size,
            "num_layers": tiny.num_layers,
            "num_heads": "hidden/64 from 1024 up, else hidden/8",
            "num_experts": tiny.num_routed_experts,
            "num_experts_per_tok": tiny.num_experts_per_tok,
            "moe_intermediate_size": "hidden/2",
            "vocab_size": tiny.vocab_size,
            "sp_threshold": "off",
        }

        def add(group, field: str, *flags: str, help: str, **kw) -> None:
            if field in wanted:
                value = values[field]
                shown = unset.get(field) if value is None else value
                if not kw.get("action"):
                    help = f"{help} (default: {shown})"
                group.add_argument(*flags, dest=field, default=value, help=help, **kw)

        par = parser.add_argument_group("parallelism")
        add(
            par,
            "tensor_parallel_size",
            "--tensor-parallel-size",
            "-tp",
            type=positive_int,
            metavar="N",
            help="ranks each layer's weights are split over",
        )
        add(
            par,
            "pipeline_parallel_size",
            "--pipeline-parallel-size",
            "-pp",
            type=positive_int,
            metavar="N",
            help="pipeline stages the layers are split into",
        )
        add(
            par,
            "sp_threshold",
            "--sp-threshold",
            type=optional_token_count,
            metavar="N",
            help="sequence parallelism: forwards of at least N tokens keep the mHC residual "
            "stream split by tokens over the tensor-parallel ranks (needs -tp > 1; None: "
            "off; `mhc-sp-bench tune` measures a good N for this machine)",
        )
        comp = parser.add_argument_group("execution")
        add(
            comp,
            "enforce_eager",
            "--enforce-eager",
            action="store_true",
            help="run every forward eagerly: no CUDA graphs and no compile pass",
        )
        add(
            comp,
            "max_cudagraph_capture_size",
            "--max-cudagraph-capture-size",
            type=non_negative_int,
            metavar="N",
            help="capture CUDA graphs for forwards of up to N tokens (CUDA only; 0: none; "
            "--sp-threshold must be above it)",
        )
        add(
            comp,
            "num_speculative_tokens",
            "--num-speculative-tokens",
            type=non_negative_int,
            metavar="K",
            help="MTP draft steps after each forward, each fed the previous step's stream",
        )
        model = parser.add_argument_group("model size (the small test model unless given)")
        add(
            model,
            "hidden_size",
            "--hidden-size",
            type=positive_int,
            metavar="H",
            help="hidden size",
        )
        add(
            model,
            "num_layers",
            "--num-layers",
            type=positive_int,
            metavar="L",
            help="decoder layers",
        )
        add(
            model,
            "num_heads",
            "--num-heads",
            type=positive_int,
            metavar="N",
            help="attention heads",
        )
        add(
            model,
            "num_experts",
            "--num-experts",
            type=positive_int,
            metavar="E",
            help="routed experts per MoE layer",
        )
        add(
            model,
            "num_experts_per_tok",
            "--num-experts-per-tok",
            type=positive_int,
            metavar="K",
            help="experts each token is routed to",
        )
        add(
            model,
            "moe_intermediate_size",
            "--moe-intermediate-size",
            type=positive_int,
            metavar="I",
            help="intermediate size of each expert",
        )
        add(
            model,
            "vocab_size",
            "--vocab-size",
            type=positive_int,
            metavar="V",
            help="vocabulary size",
        )
        add(
            model,
            "moe_backend",
            "--moe-backend",
            choices=sorted(MOE_BACKEND_SUPPORTS_SP),
            help="MoE implementation: naive computes every routed token; capacity drops "
            "tokens beyond each expert's capacity and cannot run with "
            "--sp-threshold",
        )
        add(model, "seed", "--seed", type=non_negative_int, help="seed of the synthetic weights")
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
            k: v
            for k, v in (
                ("hidden_size", self.hidden_size),
                ("num_layers", self.num_layers),
                ("num_heads", self.num_heads),
                ("num_routed_experts", self.num_experts),
                ("num_experts_per_tok", self.num_experts_per_tok),
                ("moe_intermediate_size", self.moe_intermediate_size),
                ("vocab_size", self.vocab_size),
            )
            if v is not None
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
