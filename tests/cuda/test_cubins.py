# SPDX-License-Identifier: Apache-2.0
"""What the compiler made of the hot CUDA kernels, read from the built extension's cubins of every
architecture it was built for (sm_90a and sm_100a by default) with cuobjdump (no GPU needed): on
every one of them, no kernel of V4's hc_mult (n = 4), no collective and no post_kernel keeps
anything in local memory (a stack frame: an array indexed at run time, or spilled registers); none
divides 64-bit integers (read in the embedded PTX), and the sharded boundary's first kernel lets
its programmatic dependent start early while the second waits for it.

Outside the gate, and a matter of speed only: the wide hc_mult instantiations keep the upper
levels of their projection tree in local memory (kFarLevels in cuda/device/pre.cuh), so
project_kernel<5..8> and symm_lamport_layer_kernel / symm_sharded_layer_kernel<5..8> have stack
frames of 0.8-2.2 KB (808-2,152 bytes on sm_90a and sm_100a with nvcc 13.0), reached once every
2^(kRegLevels + kSmemLevels) chunks; symm_sharded_finish_kernel<8> (256 bytes) and, on sm_100a,
finish_kernel<8> (24-120 bytes) and hc_head's finish_kernel<2> (8 bytes) have small ones too. V4
runs hc_mult 4, which the gate holds to none.

Skips, saying why, when mhc_sp was built without CUDA or no cuobjdump is found (the CUDA toolkit's,
CUDA_HOME's, or the copy in the CUDA torch wheel's triton package); bench/gpu_check.sh then marks
its step partial."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

import mhc_sp
from mhc_sp import _C

ARCH = "sm_90a"  # the architecture whose embedded PTX the PTX checks read

# Kernel families the gate covers, by the mangled name's prefix: every n = 4 instantiation of the
# pre family and of the symm boundary, and every instantiation of the collectives and the post.
GATED = {
    "project_kernel (n=4)": r"_ZN6mhc_sp4cuda14project_kernelILi4E",
    "finish_kernel (n=4)": r"_ZN6mhc_sp4cuda13finish_kernelILi4E",
    "post_kernel": r"_ZN6mhc_sp4cuda11post_kernelI",
    "symm_lamport_layer_kernel (n=4)": r"_ZN6mhc_sp4cuda25symm_lamport_layer_kernelILi4E",
    "symm_sharded_layer_kernel (n=4)": r"_ZN6mhc_sp4cuda25symm_sharded_layer_kernelILi4E",
    "symm_sharded_finish_kernel (n=4)": r"_ZN6mhc_sp4cuda26symm_sharded_finish_kernelILi4E",
    "symm_lamport_sum_kernel": r"_ZN6mhc_sp4cuda23symm_lamport_sum_kernel[IE]",
    "symm_reduce_kernel": r"_ZN6mhc_sp4cuda18symm_reduce_kernelI",
    "symm_gather_kernel": r"_ZN6mhc_sp4cuda18symm_gather_kernel[IE]",
}


def find_cuobjdump() -> str | None:
    candidates = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")]
    candidates.append("/usr/local/cuda/bin/cuobjdump")
    on_path = shutil.which("cuobjdump")
    if on_path:
        candidates.append(on_path)
    triton = importlib.util.find_spec("triton")
    if triton is not None and triton.submodule_search_locations:
        for root in triton.submodule_search_locations:
            candidates.append(os.path.join(root, "backends", "nvidia", "bin", "cuobjdump"))
    return next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)


def extension() -> Path:
    if not mhc_sp.build_info()["cuda"]:
        pytest.skip("mhc_sp was built without CUDA: there are no cubins to read")
    return Path(_C.__file__)


@lru_cache(maxsize=None)
def cuobjdump(*args: str) -> str:
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip(
            "no cuobjdump: install the CUDA toolkit (or set CUDA_HOME), or the CUDA torch "
            "wheel's triton, which carries one"
        )
    out = subprocess.run(
        [tool, *args, str(extension())], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def parse_resource_usage(text: str, arch: str) -> dict[str, dict[str, int]]:
    """{mangled kernel name: {"REG": n, "STACK": n, ...}} for the cubins of `arch`."""
    usage: dict[str, dict[str, int]] = {}
    current_arch = name = None
    for line in text.splitlines():
        m = re.match(r"\s*arch = (\S+)", line)
        if m:
            current_arch = m.group(1)
            continue
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            name = m.group(1)
            continue
        if name and current_arch == arch and "REG:" in line:
            usage[name] = {k: int(v) for k, v in re.findall(r"([A-Z_]+(?:\[\d+\])?):(\d+)", line)}
            name = None
    return usage


def gated(usage: dict) -> dict[str, str]:
    """{mangled name: family} of every gated kernel found."""
    return {
        name: family for name in usage for family, prefix in GATED.items() if re.match(prefix, name)
    }


def built_archs(elf_list: str) -> list[str]:
    """The architectures of the cubins `cuobjdump --list-elf` names (name.sm_90a.cubin, ...)."""
    return sorted(set(re.findall(r"\.(sm_\d+[a-z]?)\.cubin", elf_list)))


@pytest.fixture(scope="module")
def usages():
    """{arch: resource usage} for every architecture the extension carries cubins of."""
    extension()
    archs = built_archs(cuobjdump("--list-elf"))
    assert ARCH in archs, archs
    text = cuobjdump("--dump-resource-usage")
    return {arch: parse_resource_usage(text, arch) for arch in archs}


@pytest.fixture(scope="module")
def usage(usages):
    return usages[ARCH]


def test_parser_reads_cuobjdump_output():
    text = """
Fatbin elf code:
================
arch = sm_90a
code version = [1,8]

Resource usage:
 Common:
  GLOBAL:0
 Function _ZN6mhc_sp4cuda11post_kernelILi4ELi8EEEvNS0_8PostArgsE:
  REG:80 STACK:16 SHARED:0 LOCAL:0 CONSTANT[0]:616 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin elf code:
================
arch = sm_100a
 Function _ZN6mhc_sp4cuda11post_kernelILi4ELi1EEEvNS0_8PostArgsE:
  REG:33 STACK:0 SHARED:0 LOCAL:0
"""
    u = parse_resource_usage(text, "sm_90a")
    assert u == {
        "_ZN6mhc_sp4cuda11post_kernelILi4ELi8EEEvNS0_8PostArgsE": {
            "REG": 80,
            "STACK": 16,
            "SHARED": 0,
            "LOCAL": 0,
            "CONSTANT[0]": 616,
            "TEXTURE": 0,
            "SURFACE": 0,
            "SAMPLER": 0,
        }
    }
    assert list(gated(u).values()) == ["post_kernel"]


def test_the_architectures_are_read_from_the_elf_list():
    listing = "ELF file 1: a.sm_90a.cubin\nELF file 2: a.sm_100a.cubin\nELF file 3: b.sm_90a.cubin"
    assert built_archs(listing) == ["sm_100a", "sm_90a"]


def test_every_gated_family_is_in_the_build(usages):
    for arch, usage in usages.items():
        missing = sorted(set(GATED) - set(gated(usage).values()))
        assert not missing, f"no {arch} cubin of {missing} in {extension().name}"


def test_no_stack_frame_or_spill_in_the_hot_kernels(usages):
    bad = []
    for arch, usage in sorted(usages.items()):
        for name, family in sorted(gated(usage).items()):
            stack, local = usage[name].get("STACK", 0), usage[name].get("LOCAL", 0)
            if local > 0 or stack > 0:
                bad.append(f"{arch} {family}: {name} REG {usage[name]['REG']} STACK {stack}")
    assert not bad, "kernels with local memory (stack frame or spills):\n" + "\n".join(bad)


def parse_ptx(text: str, arch: str) -> dict[str, str]:
    """{mangled kernel name: its PTX} of the PTX embedded for `arch`."""
    out: dict[str, str] = {}
    for block in re.split(r"\n(?=Fatbin ptx code:)", text):
        if not re.search(rf"^arch = {re.escape(arch)}$", block, re.M):
            continue
        for entry in re.split(r"\n(?=\.(?:visible |weak )?\.?entry )", block):
            m = re.match(r"\.(?:visible |weak )?\.?entry (\w+)\(", entry)
            if m:
                out[m.group(1)] = entry
    return out


@pytest.fixture(scope="module")
def ptx(usage):
    return parse_ptx(cuobjdump("--dump-ptx"), ARCH)


def test_no_64_bit_division_in_the_hot_kernels(usage, ptx):
    # A 64-bit integer division is a ~70-instruction routine on the GPU: index arithmetic of the
    # copy loops walks rows and vectors by addition instead.
    names = sorted(gated(usage))
    assert set(names) <= set(ptx), sorted(set(names) - set(ptx))
    bad = [n for n in names if re.search(r"\b(div|rem)\.[su]64\b", ptx[n])]
    assert not bad, "kernels with a 64-bit integer division:\n" + "\n".join(bad)


def test_sharded_boundary_uses_programmatic_dependent_launch(usage, ptx):
    families = gated(usage)
    layer = [n for n, f in families.items() if f == "symm_sharded_layer_kernel (n=4)"]
    finish = [n for n, f in families.items() if f == "symm_sharded_finish_kernel (n=4)"]
    assert layer and finish
    # The first kernel lets its dependent's blocks be scheduled once it is only projecting; the
    # finish waits for all of it before it reads anything the first kernel wrote.
    assert all("griddepcontrol.launch_dependents;" in ptx[n] for n in layer), layer
    assert all("griddepcontrol.wait;" in ptx[n] for n in finish), finish
