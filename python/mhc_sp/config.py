"""Configuration objects: the mHC constants (``MhcConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping


@dataclass(frozen=True)
class MhcConfig:
    """mHC hyper-parameters; defaults are DeepSeek-V4's (DESIGN §1)."""

    hc_mult: int = 4
    sinkhorn_iters: int = 20
    hc_pre_eps: float = 1e-6
    hc_sinkhorn_eps: float = 1e-6
    hc_post_mult: float = 2.0
    rms_eps: float = 1e-6
    norm_eps: float = 1e-6
    hc_eps: float = 1e-6  # hc_head's weight epsilon

    def __post_init__(self):
        if not isinstance(self.hc_mult, int) or not 1 <= self.hc_mult <= 8:
            raise ValueError(f"hc_mult must be an int in [1, 8], got {self.hc_mult!r}")
        if not isinstance(self.sinkhorn_iters, int) or self.sinkhorn_iters < 1:
            raise ValueError(f"sinkhorn_iters must be a positive int, got {self.sinkhorn_iters!r}")
        for f in ("rms_eps", "norm_eps"):
            if not getattr(self, f) > 0:
                raise ValueError(f"{f} must be positive, got {getattr(self, f)!r}")
        for f in ("hc_pre_eps", "hc_sinkhorn_eps", "hc_eps"):
            if not getattr(self, f) >= 0:
                raise ValueError(f"{f} must be >= 0, got {getattr(self, f)!r}")

    @property
    def mix_rows(self) -> int:
        """Rows of the mHC projection ``fn``: n pre + n post + n*n comb logits."""
        return self.hc_mult * (self.hc_mult + 2)

    def scalars(self) -> tuple:
        """The op schemas' scalar tail S, in order."""
        return (self.rms_eps, self.hc_pre_eps, self.hc_sinkhorn_eps, self.hc_post_mult,
                self.sinkhorn_iters, self.norm_eps)

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> "MhcConfig":
        """Read a Hugging Face DeepSeek-V4 ``config.json`` dict (``hc_mult``, ``hc_sinkhorn_iters``,
        ``hc_eps``, ``rms_norm_eps``; ``hc_post_mult`` if present). Missing keys keep the defaults."""
        kw: dict[str, Any] = {}
        if "hc_mult" in cfg:
            kw["hc_mult"] = int(cfg["hc_mult"])
        if "hc_sinkhorn_iters" in cfg:
            kw["sinkhorn_iters"] = int(cfg["hc_sinkhorn_iters"])
        if "hc_eps" in cfg:
            eps = float(cfg["hc_eps"])
            kw.update(hc_pre_eps=eps, hc_sinkhorn_eps=eps, hc_eps=eps)
        if "rms_norm_eps" in cfg:
            eps = float(cfg["rms_norm_eps"])
            kw.update(rms_eps=eps, norm_eps=eps)
        if "hc_post_mult" in cfg:
            kw["hc_post_mult"] = float(cfg["hc_post_mult"])
        return cls(**kw)

    def replace(self, **changes) -> "MhcConfig":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return MhcConfig(**values)


# ---- model, parallel and engine configuration (docs/design.md §3) -------------------------------

import dataclasses
from typing import Optional


def _check_positive_int(value: Any, name: str) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an int >= 1 (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_non_negative_int(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


#: MoE backends of ``mhc_sp.model.moe`` and whether each can run on a token shard. "naive" routes
#: and computes every token independently. "capacity" drops tokens once an expert is full, in token
#: order, so which tokens it drops depends on the whole batch: on a token shard it would drop
#: different tokens than the unsharded model, so it is refused whenever SP is on.
MOE_BACKEND_SUPPORTS_TOKEN_SHARD: dict[str, bool] = {"naive": True, "capacity": False}


@dataclass(frozen=True)
class ModelConfig:
    """Dimensions of the lightweight DeepSeek-V4-style model (DESIGN §3).

    Attention is a plain causal multi-head stand-in with ``head_dim = hidden_size / num_heads``.
    The MoE has ``num_routed_experts`` experts (top ``num_experts_per_tok``) of intermediate size
    ``moe_intermediate_size`` plus ``num_shared_experts`` shared experts of the same size, fused
    into one shared MLP. ``num_mtp_layers`` is 0 or 1 (one MTP draft layer). ``seed`` seeds the
    synthetic weights.
    """

    vocab_size: int = 240
    hidden_size: int = 96
    num_layers: int = 2
    num_heads: int = 12
    num_routed_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 48
    num_shared_experts: int = 1
    routed_scaling_factor: float = 1.0
    capacity_factor: float = 1.25  # only used by the "capacity" MoE backend
    num_mtp_layers: int = 1
    mhc: MhcConfig = MhcConfig()
    seed: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_routed_experts",
                     "num_experts_per_tok", "moe_intermediate_size"):
            _check_positive_int(getattr(self, name), name)
        _check_non_negative_int(self.num_shared_experts, "num_shared_experts")
        _check_non_negative_int(self.seed, "seed")
        if self.num_mtp_layers not in (0, 1):
            raise ValueError(f"num_mtp_layers must be 0 or 1, got {self.num_mtp_layers!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must be divisible by "
                             f"num_heads={self.num_heads}")
        if self.num_experts_per_tok > self.num_routed_experts:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} must be <= "
                             f"num_routed_experts={self.num_routed_experts}")
        if not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor must be positive, got {self.capacity_factor!r}")
        if not isinstance(self.mhc, MhcConfig):
            raise TypeError(f"mhc: expected an MhcConfig, got {type(self.mhc).__name__}")

    @property
    def head_dim(self) -> int:
        """Attention head width: hidden_size / num_heads."""
        return self.hidden_size // self.num_heads

    @property
    def shared_intermediate_size(self) -> int:
        """Intermediate size of the fused shared-expert MLP (0: no shared expert)."""
        return self.num_shared_experts * self.moe_intermediate_size

    @classmethod
    def tiny(cls, **changes) -> "ModelConfig":
        """Test preset: hidden 96, 12 heads (tp 1, 2, 3, 4 all divide it), 2 layers, 8 experts
        top-2, vocab 240, one MTP layer. Keyword arguments override fields."""
        return dataclasses.replace(cls(), **changes)

    @classmethod
    def v4_flash(cls, **changes) -> "ModelConfig":
        """DeepSeek-V4-Flash dimensions: hidden 4096, 64 heads, 43 layers, 256 routed experts
        top-6, one shared expert, one MTP layer. The expert intermediate size (2048) and vocab
        (129280) are the DeepSeek-V3-family values (an assumption of this stand-in). Hundreds of
        GB of weights: build the model with ``device="meta"`` unless you mean it."""
        base = cls(vocab_size=129280, hidden_size=4096, num_layers=43, num_heads=64,
                   num_routed_experts=256, num_experts_per_tok=6, moe_intermediate_size=2048,
                   num_shared_experts=1, routed_scaling_factor=1.5, num_mtp_layers=1)
        return dataclasses.replace(base, **changes)

    @classmethod
    def preset(cls, name: str, **changes) -> "ModelConfig":
        """``"tiny"`` or ``"v4-flash"`` (also ``"v4_flash"``)."""
        presets = {"tiny": cls.tiny, "v4-flash": cls.v4_flash, "v4_flash": cls.v4_flash}
        if name not in presets:
            raise ValueError(f"preset: unknown preset {name!r}; expected one of {sorted(presets)}")
        return presets[name](**changes)

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], **changes) -> "ModelConfig":
        """Read a Hugging Face DeepSeek-V4 ``config.json`` dict: ``vocab_size``, ``hidden_size``,
        ``num_hidden_layers``, ``num_attention_heads``, ``n_routed_experts``,
        ``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts``,
        ``routed_scaling_factor``, ``num_nextn_predict_layers`` and the mHC keys of
        ``MhcConfig.from_hf_config``. Missing keys keep the ``tiny`` defaults; keyword arguments
        override the result."""
        if not isinstance(cfg, Mapping):
            raise TypeError(f"cfg: expected a mapping (a parsed config.json), got {type(cfg).__name__}")
        keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
                "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
                "n_routed_experts": "num_routed_experts", "num_experts_per_tok": "num_experts_per_tok",
                "moe_intermediate_size": "moe_intermediate_size",
                "n_shared_experts": "num_shared_experts", "num_nextn_predict_layers": "num_mtp_layers"}
        kw: dict[str, Any] = {ours: int(cfg[hf]) for hf, ours in keys.items()
                              if cfg.get(hf) is not None}
        if cfg.get("routed_scaling_factor") is not None:
            kw["routed_scaling_factor"] = float(cfg["routed_scaling_factor"])
        if kw.get("num_mtp_layers", 0) > 1:
            kw["num_mtp_layers"] = 1  # this wrapper runs one draft layer
        kw["mhc"] = MhcConfig.from_hf_config(cfg)
        kw.update(changes)
        return cls(**kw)


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor / pipeline parallel sizes and the sequence-parallel threshold.

    ``sp_threshold``: None = no SP; N > 0 = SP engages on forwards with at least N (padded)
    tokens, only with ``tensor_parallel_size > 1``.
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    sp_threshold: Optional[int] = None

    def __post_init__(self):
        _check_positive_int(self.tensor_parallel_size, "tensor_parallel_size")
        _check_positive_int(self.pipeline_parallel_size, "pipeline_parallel_size")
        if self.sp_threshold is not None:
            _check_positive_int(self.sp_threshold, "sp_threshold")

    @property
    def enable_sp(self) -> bool:
        """SP is configured: ``tp > 1`` and ``sp_threshold`` is set."""
        return self.tensor_parallel_size > 1 and self.sp_threshold is not None

    @property
    def sequence_parallel_size(self) -> int:
        """Ranks a token-sharded stream is split over: tp when SP is enabled, else 1."""
        return self.tensor_parallel_size if self.enable_sp else 1

    @property
    def world_size(self) -> int:
        """Ranks needed: tensor_parallel_size * pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True)
class PassConfig:
    """The compile-pass configuration of sequence parallelism.

    ``enable_sp``: None = the pass's default (off); True/False forces it. ``sp_min_token_num``:
    the smallest (padded) token count the pass shards. ``EngineConfig`` fills both from
    ``ParallelConfig.sp_threshold`` unless ``enforce_eager``.
    """

    enable_sp: Optional[bool] = None
    sp_min_token_num: Optional[int] = None

    def __post_init__(self):
        if self.enable_sp is not None and not isinstance(self.enable_sp, bool):
            raise ValueError(f"enable_sp must be None, True or False, got {self.enable_sp!r}")
        if self.sp_min_token_num is not None:
            _check_positive_int(self.sp_min_token_num, "sp_min_token_num")


@dataclass(frozen=True)
class CompilationConfig:
    """Compile pass settings and CUDA graph sizes. Graphs are captured for padded batch sizes
    ``1, 2, 4, 8, 16, 24, ...`` up to ``max_cudagraph_capture_size`` (0: no graphs)."""

    pass_config: PassConfig = PassConfig()
    max_cudagraph_capture_size: int = 0

    def __post_init__(self):
        if not isinstance(self.pass_config, PassConfig):
            raise TypeError(f"pass_config: expected a PassConfig, got {type(self.pass_config).__name__}")
        _check_non_negative_int(self.max_cudagraph_capture_size, "max_cudagraph_capture_size")

    def cudagraph_capture_sizes(self) -> list[int]:
        """Batch sizes graphs are captured for, ascending; the last is the maximum."""
        top = self.max_cudagraph_capture_size
        if top == 0:
            return []
        sizes = sorted({s for s in (1, 2, 4) if s <= top} | set(range(8, top + 1, 8)) | {top})
        return sizes


@dataclass(frozen=True)
class EngineConfig:
    """Everything a runner needs, validated together.

    Construction maps ``parallel.sp_threshold`` into ``compilation.pass_config`` (when not
    ``enforce_eager`` and SP is enabled: ``enable_sp=True`` and ``sp_min_token_num=sp_threshold``
    unless a minimum is already set) and enforces the rules of DESIGN §3; errors name the values.
    Read the threshold in effect from :attr:`sp_min_tokens`.
    """

    model: ModelConfig = ModelConfig()
    parallel: ParallelConfig = ParallelConfig()
    compilation: CompilationConfig = CompilationConfig()
    enforce_eager: bool = False
    moe_backend: str = "naive"

    def __post_init__(self):
        for name, cls in (("model", ModelConfig), ("parallel", ParallelConfig),
                          ("compilation", CompilationConfig)):
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"{name}: expected a {cls.__name__}, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {self.enforce_eager!r}")
        m, p = self.model, self.parallel
        tp, pp = p.tensor_parallel_size, p.pipeline_parallel_size

        # Shapes that must split evenly over the TP group.
        for name, value in (("num_heads", m.num_heads), ("moe_intermediate_size", m.moe_intermediate_size),
                            ("shared_intermediate_size", m.shared_intermediate_size),
                            ("vocab_size", m.vocab_size)):
            if value % tp:
                raise ValueError(f"model.{name}={value} must be divisible by "
                                 f"tensor_parallel_size={tp}")
        if m.num_layers < pp:
            raise ValueError(f"model.num_layers={m.num_layers} must be >= "
                             f"pipeline_parallel_size={pp} (every stage needs a layer)")

        # SP must never engage on a size that is captured as a CUDA graph.
        max_graph = self.compilation.max_cudagraph_capture_size
        if tp > 1 and p.sp_threshold is not None and p.sp_threshold <= max_graph:
            raise ValueError(f"sp_threshold={p.sp_threshold} must be greater than "
                             f"max_cudagraph_capture_size={max_graph} with tensor_parallel_size={tp}: "
                             f"SP must never engage on a captured size")

        # Map sp_threshold into the compile pass (never under enforce_eager: the eager in-forward
        # path reads sp_threshold directly).
        pc = self.compilation.pass_config
        if not self.enforce_eager and p.enable_sp:
            pc = PassConfig(enable_sp=True, sp_min_token_num=(pc.sp_min_token_num if
                            pc.sp_min_token_num is not None else p.sp_threshold))
            object.__setattr__(self, "compilation", dataclasses.replace(self.compilation, pass_config=pc))
        if not self.enforce_eager and pc.enable_sp and tp > 1:
            if pc.sp_min_token_num is None:
                raise ValueError("pass_config.enable_sp=True needs pass_config.sp_min_token_num "
                                 "(or set parallel.sp_threshold)")
            if pc.sp_min_token_num <= max_graph:
                raise ValueError(f"pass_config.sp_min_token_num={pc.sp_min_token_num} must be greater "
                                 f"than max_cudagraph_capture_size={max_graph}: SP must never engage "
                                 f"on a captured size")

        if self.moe_backend not in MOE_BACKEND_SUPPORTS_TOKEN_SHARD:
            raise ValueError(f"moe_backend: unknown backend {self.moe_backend!r}; expected one of "
                             f"{sorted(MOE_BACKEND_SUPPORTS_TOKEN_SHARD)}")
        check_moe_backend(self.moe_backend, self.sp_min_tokens is not None)

    @property
    def sp_min_tokens(self) -> Optional[int]:
        """The SP threshold in effect (None: this engine never shards). Under ``enforce_eager`` the
        eager in-forward path uses ``parallel.sp_threshold``; otherwise the compile pass's
        ``sp_min_token_num``. Always None with ``tensor_parallel_size == 1``."""
        if self.parallel.tensor_parallel_size == 1:
            return None
        if self.enforce_eager:
            return self.parallel.sp_threshold
        pc = self.compilation.pass_config
        return pc.sp_min_token_num if pc.enable_sp else None

    @property
    def use_cudagraphs(self) -> bool:
        """CUDA graphs are on (they are only used on CUDA devices)."""
        return not self.enforce_eager and self.compilation.max_cudagraph_capture_size > 0


def check_moe_backend(backend: str, sp_enabled: bool) -> None:
    """Raise NotImplementedError when SP is on and ``backend`` cannot run on a token shard."""
    if sp_enabled and not MOE_BACKEND_SUPPORTS_TOKEN_SHARD.get(backend, True):
        raise NotImplementedError(f"moe_backend={backend!r} cannot run on a token shard; it is not "
                                  f"supported with sequence parallelism (sp_threshold set, tp > 1)")
