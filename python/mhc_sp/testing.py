# SPDX-License-Identifier: Apache-2.0
"""What tests and benchmarks share: the contract's tolerances, seeded inputs, and ``OPS``, the
registry of the five math ops.

An :class:`OpInfo` ties an op's name to its ``mhc_sp.ops`` wrapper, its ``mhc_sp.reference``
function, the arguments both take (picked from a :func:`random_inputs` dict), the names of its
outputs and the bytes it must move. Tests, ``mhc-sp-bench ops`` and the GPU check all go through
it, so an op is called, compared and costed one way everywhere::

    info = OPS["mhc_pre"]
    sample = info.sample(random_inputs(T=5, n=4, H=512, seed=1))
    check_against_reference(info, sample)
    info.bytes_moved(sample)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from . import ops, reference
from .config import MhcConfig

DEFAULT = MhcConfig()

#: Fair tolerances for kernels that do fp32 math (docs/design.md §1): coefficients ...
COEFF_TOL = dict(rtol=1e-4, atol=1e-5)
#: ... and bf16 stream tensors.
BF16_TOL = dict(rtol=1e-2, atol=2e-2)


#: Why a test that needs mhc_sp._testing is skipped where it was not built.
TESTING_MODULE_MISSING = (
    "needs the testing module mhc_sp._testing: build with MHC_SP_TESTING=1 "
    "(scripts/bootstrap.sh does)"
)


def load_testing_module():
    """mhc_sp._testing (test-only bindings and the single-GPU symm harness, built with
    MHC_SP_TESTING=1), or None where it was not built."""
    try:
        from . import _testing
    except ImportError:
        return None
    return _testing


#: Why a test that needs mhc_sp._emulated is skipped where it was not built.
EMULATED_MODULE_MISSING = (
    "needs the emulated device mhc_sp._emulated: build with MHC_SP_TESTING=1 "
    "(scripts/bootstrap.sh does)"
)


def load_emulated_module():
    """mhc_sp._emulated (the CUDA device code run on the host, docs/emulation.md; built with
    MHC_SP_TESTING=1 on every machine), or None where it was not built."""
    try:
        from . import _emulated
    except ImportError:
        return None
    return _emulated


def assert_close(actual: Tensor, expected: Tensor, name: str = "") -> None:
    """The contract's tolerance for the tensor's kind: bf16 streams or fp32 coefficients. Dtypes
    and shapes must agree exactly."""
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, (
        f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    )
    tol = BF16_TOL if expected.dtype == torch.bfloat16 else COEFF_TOL
    torch.testing.assert_close(
        actual.float(), expected.float(), **tol, msg=lambda m: f"{name}: {m}"
    )


def bits(t: Tensor) -> Tensor:
    """The raw bits of a bf16 or fp32 tensor (as int16 / int32), for bitwise comparisons."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_bitwise(name: str, got: Tensor, want: Tensor) -> None:
    """``got`` is bit for bit ``want`` (NaN payloads and signed zeros included), same shape and
    dtype; the message says how many elements differ."""
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape)
    bad = int((bits(got) != bits(want)).sum())
    assert bad == 0, f"{name}: {bad} of {got.numel()} elements differ bitwise"


def random_inputs(T: int, n: int, H: int, seed: int = 0, device="cpu") -> dict:
    """Seeded tensors for every math op at DeepSeek-V4-like scales, drawn on ``device`` (the same
    seed gives other values on another device type). Keys: the stream ``residual (T, n, H)`` and
    sublayer output ``x (T, H)`` (bf16); the pre weights ``fn, scale, base``; incoming coefficients
    ``post, comb``; the head weights ``head_fn, head_scale, head_base``; ``norm_weight (H,)``."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    M = n * (n + 2)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g, device=device) * std

    def rand(*shape):
        return torch.rand(*shape, generator=g, device=device)

    comb_logits = randn(T, n, n)
    return {
        "residual": randn(T, n, H).to(torch.bfloat16),
        "x": randn(T, H).to(torch.bfloat16),
        "fn": randn(M, n * H, std=(n * H) ** -0.5),
        "scale": 0.5 + rand(3),
        "base": randn(M, std=0.5),
        "post": 2 * torch.sigmoid(randn(T, n)),
        "comb": reference.sinkhorn(comb_logits, 20, 1e-6),
        "head_fn": randn(n, n * H, std=(n * H) ** -0.5),
        "head_scale": 0.5 + rand(1),
        "head_base": randn(n, std=0.5),
        "norm_weight": (1 + randn(H, std=0.1)).to(torch.bfloat16),
    }


def stream_inputs(inputs: dict) -> tuple:
    """The stream a post reads, of a :func:`random_inputs` dict (or of its shards), in the ops'
    order: ``residual, post, comb``."""
    return inputs["residual"], inputs["post"], inputs["comb"]


def pre_weights(inputs: dict) -> tuple:
    """The next sublayer's pre arguments of a :func:`random_inputs` dict, in the ops' order:
    ``fn, scale, base, norm_weight`` (what ``mhc_pre``, ``mhc_post_pre`` and the fused boundaries
    take after the stream)."""
    return inputs["fn"], inputs["scale"], inputs["base"], inputs["norm_weight"]


def head_weights(inputs: dict) -> tuple:
    """The head's arguments of a :func:`random_inputs` dict: ``head_fn, head_scale, head_base``."""
    return inputs["head_fn"], inputs["head_scale"], inputs["head_base"]


# ---- the op registry -------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One call: ``args`` (tensors, ``None`` for an absent norm weight) and ``kwargs`` (the config,
    for the ops that take one) fit the wrapper and the reference alike."""

    args: tuple
    kwargs: dict = field(default_factory=dict)

    @property
    def cfg(self) -> MhcConfig:
        return self.kwargs.get("cfg", DEFAULT)


@dataclass(frozen=True)
class OpInfo:
    """One math op: how to call it, what to compare it with, and what it costs."""

    name: str
    #: ``mhc_sp.ops.<name>``
    op: Callable
    #: ``mhc_sp.reference.<name>``
    reference: Callable
    #: ``random_inputs`` keys of the tensor arguments, in order; ``norm_weight`` may be left out.
    arg_keys: tuple[str, ...]
    outputs: tuple[str, ...]
    #: The schema's scalar tail for a config; None for an op without scalars (no ``cfg`` either).
    scalars: Optional[Callable[[MhcConfig], tuple]]

    @property
    def takes_norm(self) -> bool:
        return "norm_weight" in self.arg_keys

    def sample(self, inputs: dict, norm: bool = True, cfg: MhcConfig = DEFAULT) -> Sample:
        """The op's arguments taken from a :func:`random_inputs`-style dict (or the golden data's
        inputs); ``norm=False`` passes no norm weight."""
        args = tuple(None if k == "norm_weight" and not norm else inputs[k] for k in self.arg_keys)
        return Sample(args, {"cfg": cfg} if self.scalars is not None else {})

    def sample_inputs(
        self,
        T: int,
        n: int,
        H: int,
        seed: int = 0,
        device="cpu",
        norm: bool = True,
        cfg: MhcConfig = DEFAULT,
    ) -> Sample:
        """A fresh seeded sample of the given shape."""
        return self.sample(random_inputs(T, n, H, seed, device), norm, cfg)

    def call(self, sample: Sample) -> tuple:
        """The op (``mhc_sp.ops``); always a tuple of ``outputs``."""
        return _as_tuple(self.op(*sample.args, **sample.kwargs))

    def call_reference(self, sample: Sample) -> tuple:
        """``mhc_sp.reference`` on the same arguments; always a tuple of ``outputs``."""
        return _as_tuple(self.reference(*sample.args, **sample.kwargs))

    def schema_args(self, sample: Sample) -> tuple:
        """Positional arguments of ``torch.ops.mhc_sp.<name>`` (for opcheck, CUDA graphs)."""
        return (*sample.args, *(self.scalars(sample.cfg) if self.scalars is not None else ()))

    def bytes_moved(self, sample: Sample) -> int:
        """Bytes the op must read and write: every tensor argument once, every output once. The
        output sizes come from the op's fake implementation (meta tensors: nothing runs)."""
        meta = tuple(a.to("meta") if isinstance(a, Tensor) else a for a in sample.args)
        outs = self.call(Sample(meta, sample.kwargs))
        return sum(t.nbytes for t in (*sample.args, *outs) if isinstance(t, Tensor))


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


_PRE_OUTPUTS = ("post", "comb", "layer_input")
_STREAM_OUTPUTS = ("residual_out", *_PRE_OUTPUTS)
_PRE_SCALARS = MhcConfig.scalars

#: name -> OpInfo for the five math ops.
OPS: dict[str, OpInfo] = {
    info.name: info
    for info in (
        OpInfo(
            "mhc_pre",
            ops.mhc_pre,
            reference.mhc_pre,
            ("residual", "fn", "scale", "base", "norm_weight"),
            _PRE_OUTPUTS,
            _PRE_SCALARS,
        ),
        OpInfo(
            "mhc_post",
            ops.mhc_post,
            reference.mhc_post,
            ("x", "residual", "post", "comb"),
            ("residual_out",),
            None,
        ),
        OpInfo(
            "mhc_post_pre",
            ops.mhc_post_pre,
            reference.mhc_post_pre,
            ("x", "residual", "post", "comb", "fn", "scale", "base", "norm_weight"),
            _STREAM_OUTPUTS,
            _PRE_SCALARS,
        ),
        OpInfo(
            "mhc_pre_broadcast",
            ops.mhc_pre_broadcast,
            reference.mhc_pre_broadcast,
            ("x", "fn", "scale", "base", "norm_weight"),
            _STREAM_OUTPUTS,
            _PRE_SCALARS,
        ),
        OpInfo(
            "hc_head",
            ops.hc_head,
            reference.hc_head,
            ("residual", "head_fn", "head_scale", "head_base"),
            ("hidden",),
            lambda cfg: (cfg.rms_eps, cfg.hc_eps),
        ),
    )
}


# ---- comparisons ----------------------------------------------------------------------------


def check_outputs(info: OpInfo, sample: Sample, got, expected) -> None:
    """Each output of ``info`` on ``sample`` against its expected value (the reference's, or the
    golden data's) at the contract's tolerance.

    ``mhc_post_pre`` is special where its stream differs from the expected one at all. Another fp32
    summation order may move a post output by one bf16 ulp; the projection and Sinkhorn amplify
    such a flip past the coefficient tolerance. So its stream is checked at bf16 tolerance, and its
    coefficients against ``reference.mhc_pre`` of the op's own stream, the only well-posed check of
    the pre half; its ``layer_input`` must still match the expected one at bf16 tolerance."""
    got, expected = tuple(got), tuple(expected)
    assert len(got) == len(expected) == len(info.outputs), (info.name, len(got), len(expected))
    for out_name, a, b in zip(info.outputs, got, expected):
        assert a.device == b.device, f"{info.name}.{out_name} on {a.device}, expected {b.device}"
    if info.name == "mhc_post_pre" and not torch.equal(got[0], expected[0]):
        assert_close(got[0], expected[0], "mhc_post_pre.residual_out")
        assert_close(got[3], expected[3], "mhc_post_pre.layer_input")
        fn, scale, base, norm_weight = (
            a.to(got[0].device) if isinstance(a, Tensor) else a for a in sample.args[4:]
        )
        expected = (got[0], *reference.mhc_pre(got[0], fn, scale, base, norm_weight, sample.cfg))
    for out_name, a, b in zip(info.outputs, got, expected):
        assert_close(a, b, f"{info.name}.{out_name}")


def check_against_reference(info: OpInfo, sample: Sample) -> None:
    """The op against the reference on the same arguments (see :func:`check_outputs`)."""
    check_outputs(info, sample, info.call(sample), info.call_reference(sample))


def check_compiled_chain(inputs: dict) -> None:
    """pre -> post -> post_pre -> head traced by ``torch.compile(fullgraph=True)`` equals eager
    bit for bit (the fake implementations and the real kernels agree on everything)."""

    def chain(residual, x, fn, scale, base, w, head_fn, head_scale, head_base):
        post, comb, layer_input = ops.mhc_pre(residual, fn, scale, base, w)
        residual = ops.mhc_post(layer_input * 2, residual, post, comb)
        residual, post, comb, layer_input = ops.mhc_post_pre(
            x, residual, post, comb, fn, scale, base, w
        )
        return ops.hc_head(residual, head_fn, head_scale, head_base), layer_input

    keys = (
        "residual",
        "x",
        "fn",
        "scale",
        "base",
        "norm_weight",
        "head_fn",
        "head_scale",
        "head_base",
    )
    args = [inputs[k] for k in keys]
    compiled = torch.compile(chain, fullgraph=True, backend="inductor")
    for a, b in zip(compiled(*args), chain(*args)):
        assert torch.equal(a, b)
