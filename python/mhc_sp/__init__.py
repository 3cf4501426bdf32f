# SPDX-License-Identifier: Apache-2.0
"""mhc_sp: sequence-parallel DeepSeek-V4 mHC residual stream as fused torch custom ops.

Importing the package registers ``torch.ops.mhc_sp.*`` (C++/CUDA kernels) and their fake
implementations. See ``mhc_sp.ops`` for the typed Python API.

The extension is compiled against one torch: importing it into another torch major.minor (or,
for a CUDA build, another CUDA major) raises ImportError, since torch's C++ ABI is not kept
across minor versions. ``MHC_SP_ALLOW_TORCH_MISMATCH=1`` imports it anyway, with a warning.
"""

import os
import re
import warnings

import torch

#: Set to 1 to import an extension built against another torch (at your own risk).
ALLOW_MISMATCH_ENV = "MHC_SP_ALLOW_TORCH_MISMATCH"
CPU_KERNELS_ENV = "MHC_SP_CPU_KERNELS"
#: How to rebuild the extension against the torch of the running environment.
REINSTALL = "pip install --no-build-isolation --no-deps --force-reinstall ."


def _major_minor(version: str) -> tuple[int, int] | None:
    """(2, 14) for "2.14.1+cu130" or "2.15.0a0+git1234"; None when it does not start so."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _build_mismatch(built: dict, torch_version: str, torch_cuda: str | None) -> str | None:
    """What differs between the torch the extension was built against (``build_info()``) and the
    running one (``torch.__version__``, ``torch.version.cuda``), or None when they match: the
    torch major.minor, and for a build with CUDA compiled the CUDA major (``cuda_runtime_built``
    is CUDART_VERSION, 1000 * major + 10 * minor). A CPU-only build uses only torch's CPU
    library, so the CUDA flavour of the torch beside it does not matter."""
    built_torch = built["torch_version"]
    built_desc, running_desc, differs = f"torch {built_torch}", f"torch {torch_version}", []
    if _major_minor(built_torch) != _major_minor(torch_version):
        differs.append("the torch major.minor")
    if built["cuda"]:
        built_cuda = built["cuda_runtime_built"] // 1000
        running_cuda = None if torch_cuda is None else int(torch_cuda.split(".")[0])
        built_desc += f" with CUDA {built_cuda}"
        running_desc += " (CPU only)" if running_cuda is None else f" with CUDA {torch_cuda}"
        if built_cuda != running_cuda:
            differs.append("the CUDA major")
    if not differs:
        return None
    return (
        f"mhc_sp: its extension mhc_sp._C was built against {built_desc}, but this environment "
        f"runs {running_desc} ({' and '.join(differs)} differ{'s' if len(differs) == 1 else ''}). "
        "torch's C++ ABI is not kept across minor versions (nor CUDA majors), so the extension "
        "may crash or compute wrong results. Rebuild it against this torch, in mhc_sp's source "
        f"folder: {REINSTALL}"
    )


#: The command-line tool of this package (``mhc_sp.bench``), for :func:`_refuse`.
BENCH_COMMAND = "mhc-sp-bench"


def _running_bench_command() -> bool:
    """Whether this process is ``mhc-sp-bench`` (the console script, or ``python -m
    mhc_sp.bench``): importing this package is then the command's first step, before any of
    the command's own code can catch an ImportError."""
    import sys

    argv = getattr(sys, "orig_argv", sys.argv)
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    return script == BENCH_COMMAND or any(
        a == "-m" and b == "mhc_sp.bench" for a, b in zip(argv, argv[1:])
    )


def _refuse(message: str) -> None:
    """Refuse the import: ImportError, or for ``mhc-sp-bench`` one line and exit status 2 (a
    refusal is a problem of the environment to fix, not a fault to debug with a traceback)."""
    if _running_bench_command():
        import sys

        print(f"{BENCH_COMMAND}: error: {message}", file=sys.stderr)
        raise SystemExit(2)
    raise ImportError(message)


def _check_build(built: dict) -> None:
    problem = _build_mismatch(built, torch.__version__, torch.version.cuda)
    if problem is None:
        return
    if os.environ.get(ALLOW_MISMATCH_ENV) != "1":
        _refuse(f"{problem}  (to import it anyway, at your own risk: {ALLOW_MISMATCH_ENV}=1)")
    warnings.warn(
        f"{problem}  (imported anyway: {ALLOW_MISMATCH_ENV}=1)", RuntimeWarning, stacklevel=2
    )


try:
    from . import _C  # registers the ops; loads libtorch's symbols, so after `import torch`
except ImportError as e:
    # An extension built against another torch typically fails here on a missing symbol.
    _refuse(
        f"mhc_sp: its extension mhc_sp._C does not load into torch {torch.__version__} ({e}). "
        f"If it was built against another torch, rebuild it against this one, in mhc_sp's "
        f"source folder: {REINSTALL}"
    )
# The CPU kernel table is picked on the extension's first use (here): the best the CPU has, or the
# one MHC_SP_CPU_KERNELS names (default, avx2, avx512, avx512_bf16, and in testing builds the
# emulated avx512_emulated, avx512_bf16_emulated; refused where the CPU lacks what it needs).
_CPU_KERNELS_FORCED = os.environ.get(CPU_KERNELS_ENV, "")
_check_build(_C.build_info())

from . import _fake  # noqa: E402, F401  (registers the fake implementations)
from .config import MhcConfig  # noqa: E402

__all__ = ["MhcConfig", "build_info"]


def build_info() -> dict:
    """How the extension was built: torch version, CPU kernel ISA (``cpu_kernels``, and
    ``cpu_kernels_choice``: ``auto``, or ``MHC_SP_CPU_KERNELS=<name>`` when forced), NVTX ranges
    (``nvtx``), CUDA, arch list (comma-joined, e.g. "9.0a,10.0a"), NCCL version."""
    info = dict(_C.build_info())
    forced = _CPU_KERNELS_FORCED
    info["cpu_kernels_choice"] = f"{CPU_KERNELS_ENV}={forced}" if forced else "auto"
    return info
