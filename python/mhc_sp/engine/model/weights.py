# SPDX-License-Identifier: Apache-2.0
"""Weights: seeded synthetic tensors and a safetensors loader, both by parameter name.

Every parameter made by ``parallel.make_param`` knows its full shape, its shard dim and its
synthetic init kind. A full-size tensor is produced (generated or read) once per name and sliced
for this rank with ``parallel.shard_index``: the same slicing for both, so any tp reproduces tp=1
and a checkpoint written from the tp=1 model loads into any tp.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Union

import torch
from torch import nn

from .parallel import shard_index

#: Synthetic init kinds: how a full tensor of a given kind is drawn from a seeded generator.
INIT_KINDS = ("linear", "embedding", "norm", "hc_fn", "hc_scale", "hc_base")


def synthetic_full(name: str, full_shape: tuple[int, ...], init: str, seed: int) -> torch.Tensor:
    """The full-size fp32 tensor for parameter ``name``. Each name has its own generator seeded from
    ``(seed, crc32(name))``, so a tensor does not depend on which other tensors a rank creates (a
    pipeline stage makes only its own layers)."""
    g = torch.Generator().manual_seed((seed * 0x9E3779B1 + zlib.crc32(name.encode())) % (2**63))
    if init in ("linear", "hc_fn"):  # variance-preserving for x @ W^T over the last dim
        return torch.randn(full_shape, generator=g) * full_shape[-1] ** -0.5
    if init == "embedding":
        return torch.randn(full_shape, generator=g)
    if init == "norm":
        return 1 + 0.1 * torch.randn(full_shape, generator=g)
    if init == "hc_scale":
        return 0.5 + torch.rand(full_shape, generator=g)
    if init == "hc_base":
        return 0.5 * torch.randn(full_shape, generator=g)
    raise ValueError(f"init: unknown init kind {init!r} for {name}; expected one of {INIT_KINDS}")


def _sharded_params(model: nn.Module):
    for name, p in model.named_parameters():
        if not hasattr(p, "full_shape"):
            raise ValueError(
                f"{name}: parameter was not made by mhc_sp.engine.model.parallel.make_param"
            )
        yield name, p


@torch.no_grad()
def init_synthetic(model: nn.Module, seed: int) -> None:
    """Fill every parameter of ``model`` with its rank's slice of the seeded full tensor."""
    for name, p in _sharded_params(model):
        full = synthetic_full(name, p.full_shape, p.init_kind, seed)
        p.copy_(full[shard_index(p.full_shape, p.shard_dim, p.tp_rank, p.tp_size)])


def synthetic_state_dict(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """The *full-size* synthetic tensors of every parameter name of ``model`` (in the parameters'
    dtypes), e.g. to write a checkpoint that the loader then slices per rank."""
    return {
        name: synthetic_full(name, p.full_shape, p.init_kind, seed).to(p.dtype)
        for name, p in _sharded_params(model)
    }


@dataclass
class LoadReport:
    """What :func:`load_safetensors` did. ``missing``: model parameters no file provided (they keep
    their current values); ``unexpected``: checkpoint tensors no parameter maps to."""

    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing missing and nothing unexpected."""
        return not self.missing and not self.unexpected


NameMap = Union[Mapping[str, str], Callable[[str], Optional[str]], None]


@torch.no_grad()
def load_safetensors(
    model: nn.Module,
    paths: Union[str, os.PathLike, Iterable[Union[str, os.PathLike]]],
    name_map: NameMap = None,
    strict: bool = False,
) -> LoadReport:
    """Load full-size tensors by name from one or more ``.safetensors`` files into ``model``,
    reading only this rank's slice of each.

    ``name_map`` turns a checkpoint tensor name into a parameter name (a dict, or a function
    returning None to skip a tensor); default: identity. A tensor whose shape is not the
    parameter's full shape raises ValueError naming both. ``strict``: raise ValueError listing the
    missing and unexpected names instead of only reporting them.
    """
    from safetensors import safe_open

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("paths: expected at least one .safetensors file")
    if name_map is None:
        mapper: Callable[[str], Optional[str]] = lambda n: n  # noqa: E731
    elif isinstance(name_map, Mapping):
        mapper = name_map.get
    elif callable(name_map):
        mapper = name_map
    else:
        raise TypeError(
            f"name_map: expected a mapping, a callable or None, got {type(name_map).__name__}"
        )

    params = dict(_sharded_params(model))
    report = LoadReport()
    seen: set[str] = set()
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"paths: no such file {path!r}")
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                target = mapper(key)
                if target is None or target not in params:
                    report.unexpected.append(key)
                    continue
                p = params[target]
                sl = f.get_slice(key)
                shape = tuple(sl.get_shape())
                if shape != p.full_shape:
                    raise ValueError(
                        f"{key}: checkpoint shape {shape} does not match parameter "
                        f"{target}'s full shape {p.full_shape}"
                    )
                part = sl[shard_index(p.full_shape, p.shard_dim, p.tp_rank, p.tp_size)]
                p.copy_(part.to(dtype=p.dtype))
                if target in seen:
                    raise ValueError(f"{key}: parameter {target} is provided twice")
                seen.add(target)
                report.loaded.append(target)
    report.missing = [n for n in params if n not in seen]
    if strict and not report.ok:
        raise ValueError(
            f"checkpoint does not match the model: missing {report.missing}, "
            f"unexpected {report.unexpected}"
        )
    return report
