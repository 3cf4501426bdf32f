# SPDX-License-Identifier: Apache-2.0
"""Golden data for the five math ops: float64 math, written apart from the fp32 kernels and from
mhc_sp.reference, straight from the formulas of docs/design.md §1.

    python tests/data/mhc_golden.py            # (re)write tests/data/mhc_golden.pt
    python tests/data/mhc_golden.py --check    # exit 1 unless the file equals a fresh build

Inputs come from NumPy's PCG64 bit stream (stable across versions and platforms) turned into
values with exact arithmetic only, so every machine draws the same tensors. The math runs in
float64 and each output is rounded once to its dtype: fp32 coefficients, bf16 streams (correctly
rounded, not through fp32). To keep the file small, ``fn`` and ``head_fn`` are drawn as int8
multiples of a power-of-two step and stored that way, and outputs that repeat others are stored
once; :func:`load` restores both exactly.

Making the data needs torch and numpy, loading it torch alone; mhc_sp is not imported.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
from pathlib import Path

import torch

PATH = Path(__file__).with_name("mhc_golden.pt")
FORMAT = 1

#: DeepSeek-V4's constants; the data is made with these and only these.
CONSTANTS = dict(
    rms_eps=1e-6,
    hc_pre_eps=1e-6,
    hc_sinkhorn_eps=1e-6,
    hc_post_mult=2.0,
    sinkhorn_iters=20,
    norm_eps=1e-6,
    hc_eps=1e-6,
)

#: Weights stored as int8 multiples of a power-of-two step: ``<name>_q`` and ``<name>_step``.
QUANTIZED = ("fn", "head_fn")

#: Token scales of the "magnitudes" case: a zero token, tiny, sub-eps, unit, large, very large.
MAGNITUDES = (0.0, 2.0**-66, 2.0**-10, 1.0, 2.0**5, 2.0**10, 2.0**17)

# (name, T, n, H, norm weight dtype, seed). The V4 shapes (n=4, H 4096 and 7168) at decode-like
# token counts, the kernels' block edges, no tokens, odd hidden sizes, other stream counts, and
# tokens of very different magnitudes.
CASES = [
    ("v4_flash_decode", 1, 4, 4096, torch.bfloat16, 1),
    ("v4_pro_two_tokens", 2, 4, 7168, torch.bfloat16, 2),
    ("v4_block_edge", 17, 4, 512, torch.bfloat16, 3),
    ("no_tokens", 0, 4, 256, torch.bfloat16, 4),
    ("odd_hidden", 5, 4, 33, torch.float32, 5),
    ("odd_hidden_small", 3, 2, 7, torch.bfloat16, 6),
    ("hc_mult_1", 4, 1, 64, torch.bfloat16, 7),
    ("hc_mult_2", 3, 2, 100, torch.float32, 8),
    ("hc_mult_3", 2, 3, 72, torch.bfloat16, 9),
    ("hc_mult_8", 2, 8, 48, torch.bfloat16, 10),
    ("magnitudes", len(MAGNITUDES), 4, 512, torch.bfloat16, 11),
]

PRE_OPS = ("mhc_pre", "mhc_post_pre", "mhc_pre_broadcast")


# ---- inputs: exact arithmetic on a stable bit stream -----------------------------------------


class Draw:
    """Values from one seeded PCG64 stream using only exactly rounded operations."""

    def __init__(self, seed: int):
        import numpy as np  # only to make the data: load() needs torch alone

        self.np = np
        self.bits = np.random.PCG64(seed)

    def uniform(self, *shape) -> torch.Tensor:
        """float64 multiples of 2^-24 in [0, 1)."""
        np = self.np
        raw = self.bits.random_raw(math.prod(shape)) >> np.uint64(40)
        return torch.from_numpy(raw.astype(np.float64) * 2.0**-24).reshape(shape)

    def normal(self, *shape, std: float = 1.0) -> torch.Tensor:
        """Approximately normal (sum of four uniforms), mean 0, standard deviation ``std``."""
        u = self.uniform(4, *shape)
        return (u[0] + u[1] + u[2] + u[3] - 2.0) * (math.sqrt(3.0) * std)

    def weight(self, *shape, std: float) -> tuple[torch.Tensor, float]:
        """(int8 q, step): ``q * step`` is approximately normal with deviation ``std``; the step is
        a power of two with about 32 steps per deviation (|q| stays below 3.5 * 32 < 127)."""
        step = 2.0 ** math.floor(math.log2(std / 32))
        return torch.round(self.normal(*shape, std=std) / step).to(torch.int8), step


def draw_inputs(
    T: int, n: int, H: int, norm_dtype: torch.dtype, seed: int, token_scale=None
) -> dict:
    """One case's inputs as stored: the ops' tensors, with ``fn``/``head_fn`` as ``*_q``/``*_step``
    (see :func:`unpack_inputs`). ``token_scale`` multiplies each token's ``residual`` and ``x``."""
    d = Draw(seed)
    M = n * (n + 2)
    residual = d.normal(T, n, H)
    x = d.normal(T, H)
    if token_scale is not None:
        scale = torch.tensor(token_scale, dtype=torch.float64)
        residual = residual * scale.view(T, 1, 1)
        x = x * scale.view(T, 1)
    fn_q, fn_step = d.weight(M, n * H, std=(n * H) ** -0.5)
    head_q, head_step = d.weight(n, n * H, std=(n * H) ** -0.5)
    comb = d.uniform(T, n, n) + 0.05
    for _ in range(3):  # roughly doubly stochastic; sums written out so their order is fixed
        comb = comb / _sum_last(comb).unsqueeze(-1)
        comb = comb / _sum_last(comb.transpose(-1, -2)).unsqueeze(-2)
    return {
        "residual": residual.to(torch.bfloat16),
        "x": x.to(torch.bfloat16),
        "fn_q": fn_q,
        "fn_step": fn_step,
        "scale": (0.5 + d.uniform(3)).float(),
        "base": d.normal(M, std=0.5).float(),
        "post": (2.0 * d.uniform(T, n)).float(),
        "comb": comb.float(),
        "head_fn_q": head_q,
        "head_fn_step": head_step,
        "head_scale": (0.5 + d.uniform(1)).float(),
        "head_base": d.normal(n, std=0.5).float(),
        "norm_weight": (1.0 + d.normal(H, std=0.1)).to(norm_dtype),
    }


def unpack_inputs(stored: dict) -> dict:
    """The ops' inputs (``random_inputs`` keys): ``fn = fn_q * fn_step`` in fp32, exactly."""
    inputs = {k: v for k, v in stored.items() if not k.endswith(("_q", "_step"))}
    for k in QUANTIZED:
        inputs[k] = stored[f"{k}_q"].float() * stored[f"{k}_step"]
    return inputs


def _sum_last(t: torch.Tensor) -> torch.Tensor:
    total = t[..., 0]
    for k in range(1, t.shape[-1]):
        total = total + t[..., k]
    return total


# ---- the math in float64 (docs/design.md §1) -----------------------------------------------


def to_bf16(v: torch.Tensor) -> torch.Tensor:
    """float64 -> bf16 rounded to nearest even once. Going through fp32 can round twice: an fp32
    value that lands exactly halfway between two bf16 values is moved one fp32 ulp towards the
    float64 value first, so that the second rounding goes the way the first would have."""
    f = v.float()
    halfway = (f.view(torch.int32) & 0xFFFF) == 0x8000
    inexact = f.double() != v
    towards = torch.where(v > f.double(), math.inf, -math.inf).float()
    f = torch.where(halfway & inexact, torch.nextafter(f, towards), f)
    return f.to(torch.bfloat16)


def f64(t):
    return None if t is None else t.double()


def projection(residual, fn, eps):
    """mix = (X @ fn^T) * rsqrt(mean(X^2) + eps) with X the token's n*H stream values."""
    T, n, H = residual.shape
    X = residual.reshape(T, n * H)
    return (X @ fn.t()) / torch.sqrt(X.square().mean(-1, keepdim=True) + eps)


def sinkhorn(logits, iters, eps):
    c = torch.softmax(logits, -1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def pre(residual_bf16, fn, scale, base, norm_weight, k=CONSTANTS):
    """-> post (T, n) fp32, comb (T, n, n) fp32, layer_input (T, H) bf16."""
    residual = f64(residual_bf16)
    T, n, H = residual.shape
    mix = projection(residual, fn, k["rms_eps"])
    s, b = scale, base
    pre_w = torch.sigmoid(mix[:, :n] * s[0] + b[:n]) + k["hc_pre_eps"]
    post = torch.sigmoid(mix[:, n : 2 * n] * s[1] + b[n : 2 * n]) * k["hc_post_mult"]
    logits = (mix[:, 2 * n :] * s[2] + b[2 * n :]).reshape(T, n, n)
    comb = sinkhorn(logits, k["sinkhorn_iters"], k["hc_sinkhorn_eps"])
    layer_input = to_bf16((pre_w.unsqueeze(-1) * residual).sum(1))
    if norm_weight is not None:
        y = f64(layer_input)
        rms = torch.sqrt(y.square().mean(-1, keepdim=True) + k["norm_eps"])
        layer_input = to_bf16(y / rms * norm_weight)
    return post.float(), comb.float(), layer_input


def post_op(x, residual, post, comb):
    """out[t, j] = post[t, j] x[t] + sum_i comb[t, i, j] residual[t, i] -> (T, n, H) bf16."""
    mixed = torch.einsum("tij,tih->tjh", comb, residual)
    return to_bf16(post.unsqueeze(-1) * x.unsqueeze(1) + mixed)


def head(residual_bf16, fn, scale, base, k=CONSTANTS):
    residual = f64(residual_bf16)
    w = torch.sigmoid(projection(residual, fn, k["rms_eps"]) * scale[0] + base) + k["hc_eps"]
    return to_bf16((w.unsqueeze(-1) * residual).sum(1))


def expected_outputs(i: dict, norm: bool) -> dict:
    """op -> {output name: tensor} for inputs ``i`` (the ops' dtypes), with or without the norm."""
    d = {k: f64(v) for k, v in i.items()}
    w = d["norm_weight"] if norm else None
    n = i["residual"].shape[1]
    out = {}
    out["mhc_pre"] = dict(
        zip(("post", "comb", "layer_input"), pre(i["residual"], d["fn"], d["scale"], d["base"], w))
    )
    stream = post_op(d["x"], d["residual"], d["post"], d["comb"])
    out["mhc_post"] = {"residual_out": stream}
    out["mhc_post_pre"] = dict(
        zip(
            ("residual_out", "post", "comb", "layer_input"),
            (stream, *pre(stream, d["fn"], d["scale"], d["base"], w)),
        )
    )
    broadcast = _broadcast(i["x"], n)
    out["mhc_pre_broadcast"] = dict(
        zip(
            ("residual_out", "post", "comb", "layer_input"),
            (broadcast, *pre(broadcast, d["fn"], d["scale"], d["base"], w)),
        )
    )
    out["hc_head"] = {"hidden": head(i["residual"], d["head_fn"], d["head_scale"], d["head_base"])}
    return out


# ---- the file ---------------------------------------------------------------------------------


def build() -> dict:
    """The whole file's content. One thread, so that float64 sums keep one order on every run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _build()
    finally:
        torch.set_num_threads(threads)


def _build() -> dict:
    cases = []
    for name, T, n, H, norm_dtype, seed in CASES:
        scales = MAGNITUDES if name == "magnitudes" else None
        stored = draw_inputs(T, n, H, norm_dtype, seed, scales)
        inputs = unpack_inputs(stored)
        expected = expected_outputs(inputs, norm=True)
        no_norm = expected_outputs(inputs, norm=False)
        # Stored once: post_pre's stream is mhc_post's, broadcast's is x repeated (see load()).
        assert torch.equal(
            expected["mhc_post_pre"].pop("residual_out"), expected["mhc_post"]["residual_out"]
        )
        assert torch.equal(
            expected["mhc_pre_broadcast"].pop("residual_out"), _broadcast(inputs["x"], n)
        )
        cases.append(
            {
                "name": name,
                "T": T,
                "n": n,
                "H": H,
                "inputs": stored,
                "expected": expected,
                "expected_no_norm": {
                    op: {"layer_input": no_norm[op]["layer_input"]} for op in PRE_OPS
                },
            }
        )
    return {"format": FORMAT, "constants": dict(CONSTANTS), "cases": cases}


def _broadcast(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.unsqueeze(1).expand(x.shape[0], n, x.shape[1]).contiguous()


def serialize(doc: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(doc, buf)
    return buf.getvalue()


def load(path=PATH) -> dict:
    """The golden data, ready to use. Each case has ``inputs`` (the ops' tensors, keys as in
    ``mhc_sp.testing.random_inputs``), and ``expected[op]`` / ``expected_no_norm[op]``: every
    output of the op by name, with and without the norm weight (the same where it has none)."""
    doc = torch.load(path, weights_only=True)
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: format {doc.get('format')!r}, expected {FORMAT}")
    for case in doc["cases"]:
        case["inputs"] = inputs = unpack_inputs(case["inputs"])
        expected = case["expected"]
        expected["mhc_post_pre"]["residual_out"] = expected["mhc_post"]["residual_out"]
        expected["mhc_pre_broadcast"]["residual_out"] = _broadcast(inputs["x"], case["n"])
        case["expected_no_norm"] = {
            op: {**outs, **case["expected_no_norm"].get(op, {})} for op, outs in expected.items()
        }
    return doc


def differences(a, b, where="") -> list[str]:
    """Where two builds differ (tensors compared bit for bit, dtype included)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(_bits(a), _bits(b))
        )
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} != {len(b)} items"]
        return [d for k, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}/{k}")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with the file, write nothing")
    p.add_argument("--out", type=Path, default=PATH)
    args = p.parse_args(argv)
    doc = build()
    if args.check:
        diff = differences(doc, torch.load(args.out, weights_only=True))
        for d in diff:
            print("differs:", d)
        return 1 if diff else 0
    args.out.write_bytes(serialize(doc))
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(doc['cases'])} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
