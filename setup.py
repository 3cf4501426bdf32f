# SPDX-License-Identifier: Apache-2.0
"""Build mhc_sp's C++/CUDA extension (mhc_sp._C) with CMake + Ninja.

Switches (environment):
  MHC_SP_CUDA=auto|0|1    compile the CUDA sources (auto: when torch has CUDA and nvcc is found)
  TORCH_CUDA_ARCH_LIST     CUDA architectures, default "9.0a;10.0a" (Hopper, Blackwell; "9.0a"
                           alone when nvcc predates 12.8, which added sm_100a)
  CUDA_HOME                CUDA toolkit root (default /usr/local/cuda when it holds nvcc)
  MAX_JOBS                 parallel compile jobs
  MHC_SP_DEBUG=1           -O0 -g build
  MHC_SP_NVTX=auto|0       NVTX ranges (auto: when the NVTX v3 headers are found: the nvidia-nvtx
                           wheel that CUDA builds of torch depend on, else the CUDA toolkit's);
                           with them the recording NVTX tool (tools/nvtx_record) is built beside
                           the extension
  MHC_SP_TESTING=0|1      build the test-only modules beside mhc_sp._C: mhc_sp._testing (test-only
                           bindings and the single-GPU symm harness) and mhc_sp._emulated (the CUDA
                           device code run on the host, docs/emulation.md); scripts/bootstrap.sh
                           and bench/gpu_check.sh set 1
  MHC_SP_SANITIZE=address,undefined (or thread)
                           build the C++ (CPU kernels, transports, ops, the emulated device) with
                           these sanitizers, in a build folder of its own; scripts/sanitize.sh
                           installs such a build beside the normal one and runs tests under it
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import SetupError

ROOT = Path(__file__).resolve().parent


def _find_nvcc():
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    for nvcc in candidates:
        if nvcc.is_file():
            return nvcc.resolve()
    return None


def _cuda_decision(torch):
    mode = os.environ.get("MHC_SP_CUDA", "auto").lower()
    if mode not in ("auto", "0", "1"):
        raise RuntimeError(f"MHC_SP_CUDA must be auto, 0 or 1, got {mode!r}")
    if mode == "0":
        return None
    nvcc = _find_nvcc()
    problems = []
    if torch.version.cuda is None:
        problems.append(f"torch {torch.__version__} is a CPU-only build")
    if nvcc is None:
        problems.append("nvcc not found (set CUDA_HOME)")
    if problems:
        if mode == "1":
            raise RuntimeError("MHC_SP_CUDA=1 but " + "; ".join(problems))
        print("mhc_sp: building without CUDA: " + "; ".join(problems), file=sys.stderr)
        return None
    return nvcc


def _default_arch_list(nvcc):
    release = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    version = release.split("release ")[-1].split(",")[0] if "release " in release else "0.0"
    major, minor = (int(part) for part in version.split(".")[:2])
    return "9.0a;10.0a" if (major, minor) >= (12, 8) else "9.0a"


def _arch_items(arch_list):
    # TORCH_CUDA_ARCH_LIST separates with ";", "," or spaces.
    return [
        item.strip()
        for item in arch_list.replace(",", ";").replace(" ", ";").split(";")
        if item.strip()
    ]


def _cuda_architectures(arch_list):
    # "9.0a;10.0a" -> "90a;100a" (CMake CUDA_ARCHITECTURES syntax)
    return ";".join(item.replace("+PTX", "").replace(".", "") for item in _arch_items(arch_list))


#: What MHC_SP_SANITIZE may name (compiler -fsanitize= values; thread alone, the others together).
SANITIZERS = ("address", "undefined", "leak", "thread")


def _sanitizers():
    """The sorted -fsanitize= values MHC_SP_SANITIZE asks for ("" for none)."""
    items = [v.strip() for v in os.environ.get("MHC_SP_SANITIZE", "").split(",") if v.strip()]
    unknown = [v for v in items if v not in SANITIZERS]
    if unknown:
        raise RuntimeError(
            f"MHC_SP_SANITIZE: expected a comma list of {', '.join(SANITIZERS)}, got {unknown}"
        )
    if "thread" in items and len(set(items)) > 1:
        raise RuntimeError("MHC_SP_SANITIZE: thread cannot be combined with another sanitizer")
    return ",".join(sorted(set(items)))


def _nccl_dirs():
    try:
        import nvidia.nccl as nccl_pkg
    except ImportError:
        return None
    for base in nccl_pkg.__path__:
        base = Path(base)
        if (base / "include" / "nccl.h").is_file() and (base / "lib" / "libnccl.so.2").is_file():
            return base / "include", base / "lib"
    return None


def _nvtx_include():
    """The folder holding nvtx3/nvToolsExt.h: the nvidia-nvtx wheel's (nvidia/cu13/include,
    nvidia/nvtx/include), else CUDA_HOME's or /usr/local/cuda's; None when there is none or
    MHC_SP_NVTX=0."""
    mode = os.environ.get("MHC_SP_NVTX", "auto").lower()
    if mode not in ("auto", "0"):
        raise RuntimeError(f"MHC_SP_NVTX must be auto or 0, got {mode!r}")
    if mode == "0":
        return None
    folders = []
    try:
        import nvidia

        for base in nvidia.__path__:
            folders += sorted(Path(base).glob("*/include"))
    except ImportError:
        pass
    if os.environ.get("CUDA_HOME"):
        folders.append(Path(os.environ["CUDA_HOME"]) / "include")
    folders.append(Path("/usr/local/cuda/include"))
    for folder in folders:
        if (folder / "nvtx3" / "nvToolsExt.h").is_file():
            return folder.resolve()
    return None


def _runtime_libstdcxx():
    """The shared libstdc++ this Python process runs with (the one torch loaded), from
    /proc/self/maps; "" when none is mapped (not Linux, or a statically linked C++ runtime). The
    modules must use that one library: CMakeLists.txt links it by path when the compiler has no
    shared libstdc++ of its own."""
    import torch  # noqa: F401  (maps the C++ runtime torch was built against)

    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return ""
    for line in maps:
        fields = line.split(maxsplit=5)  # address, perms, offset, dev, inode, path
        if len(fields) == 6 and Path(fields[5]).name.startswith("libstdc++.so"):
            return fields[5]
    return ""


def _check_shared_libstdcxx(modules):
    """Every built C++ module needs the shared libstdc++ (CMakeLists.txt says why); a compiler
    configured to link it statically is refused here, before a module crashes at its first error
    message. Checked with readelf where it is installed."""
    readelf = shutil.which("readelf")
    for module in modules:
        if readelf is None or not module.is_file():
            continue
        dynamic = subprocess.run([readelf, "-d", str(module)], capture_output=True, text=True)
        if "libstdc++.so" not in dynamic.stdout:
            raise SetupError(
                f"{module.name}: linked without the shared libstdc++ (readelf -d lists no "
                "libstdc++.so): the compiler linked a private copy of the C++ runtime. Build with "
                "a compiler that links libstdc++ as a shared library."
            )


def _testing():
    """Whether MHC_SP_TESTING asks for the testing module."""
    mode = os.environ.get("MHC_SP_TESTING", "0")
    if mode not in ("0", "1"):
        raise RuntimeError(f"MHC_SP_TESTING must be 0 or 1, got {mode!r}")
    return mode == "1"


def _tool(module_name, binary):
    """The cmake / ninja of the pip packages when installed (the system's may be too old)."""
    try:
        module = __import__(module_name)
        path = (
            Path(getattr(module, "CMAKE_BIN_DIR" if module_name == "cmake" else "BIN_DIR")) / binary
        )
        if path.is_file():
            return str(path)
    except (ImportError, AttributeError):
        pass
    found = shutil.which(binary)
    if found is None:
        raise RuntimeError(f"{binary} not found: pip install {module_name}")
    return found


#: The commands that build mhc_sp against the torch of the environment they run in.
INSTALL_HERE = "pip install --no-build-isolation ."
WHEEL_FOR_CLUSTER = "pip wheel --no-build-isolation --no-deps ."


def _require_target_torch():
    """mhc_sp's extension compiles against the torch that this Python imports, and only works with
    that torch's major.minor (mhc_sp refuses another at import). A build-isolated build (pip's
    default, python -m build, uv) runs in a temporary environment that cannot see the target
    environment's torch; with torch not among the build requirements it has none at all, so the
    build stops here, before it compiles anything, instead of building against whatever torch
    the registry offers that day."""
    try:
        import torch
    except ImportError as e:
        raise SetupError(
            f"mhc_sp: no torch to build against ({e}). mhc_sp compiles against the torch of the "
            "environment it is installed into, and a build-isolated build (pip's default, "
            "python -m build, uv) cannot see that environment. In the environment that holds "
            f"the torch to use, run: {INSTALL_HERE}   (a wheel for machines with the same torch: "
            f"{WHEEL_FOR_CLUSTER}; build tools, if missing: pip install setuptools wheel ninja "
            "'cmake>=3.24' pybind11)"
        ) from None
    print(
        f"mhc_sp: building against torch {torch.__version__} at {Path(torch.__file__).parent}",
        file=sys.stderr,
    )


def _deliver(built_dir: Path, out_dir: Path, wanted: list[str], known: list[str]) -> None:
    """Copies the `wanted` modules that CMake built into built_dir to out_dir (through a
    temporary name, so that a process that has the old file mapped keeps it), and removes from
    out_dir every other file of `known`, so that nothing an earlier build left there is shipped."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in known:
        built, target = built_dir / name, out_dir / name
        if name in wanted and built.is_file():
            partial = target.with_name(target.name + ".partial")
            shutil.copy2(built, partial)
            os.replace(partial, target)
        else:
            target.unlink(missing_ok=True)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    # The recording NVTX tool, built beside the module when NVTX is on (CMakeLists.txt).
    NVTX_RECORDER = "libmhc_sp_nvtx_record.so"

    @staticmethod
    def _beside(module: Path) -> list[str]:
        """Files CMake builds beside the module: the NVTX recorder, then the test-only modules
        (the testing module and the emulated device)."""
        return [
            CMakeBuild.NVTX_RECORDER,
            module.name.replace("_C", "_testing", 1),
            module.name.replace("_C", "_emulated", 1),
        ]

    def copy_extensions_to_source(self):
        """Editable installs: the module, and what is built beside it (a stale one goes)."""
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace, regular = self._get_inplace_equivalent(build_py, ext)
            for name in self._beside(Path(regular)):
                built = Path(regular).with_name(name)
                target = Path(inplace).with_name(name)
                if built.is_file():
                    self.copy_file(str(built), str(target), level=self.verbose)
                elif target.is_file():
                    target.unlink()

    def run(self):
        _require_target_torch()  # before anything is configured or compiled
        super().run()

    def build_extension(self, ext):
        import pybind11
        import torch
        from torch.utils import cpp_extension

        out_path = Path(self.get_ext_fullpath(ext.name)).resolve()
        # A fixed build folder keeps rebuilds (editable installs included) incremental.
        tag = "cuda" if os.environ.get("MHC_SP_CUDA", "auto") != "0" else "cpu"
        sanitize = _sanitizers()
        if sanitize:  # never mixed with the objects of a normal build
            tag += "-sanitize-" + sanitize.replace(",", "-")
        build_dir = ROOT / "build" / f"cmake-{sys.implementation.cache_tag}-{tag}"
        build_dir.mkdir(parents=True, exist_ok=True)

        nvcc = _cuda_decision(torch)
        arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST") or (
            _default_arch_list(nvcc) if nvcc is not None else ""
        )
        torch_lib = Path(torch.__file__).parent / "lib"
        # CMake links into this configuration's own folder and the modules are copied out after
        # every build: setuptools' build_lib is shared by every configuration (a sanitizer build
        # whose modules ninja found up to date would otherwise ship another build's modules).
        staged = build_dir / "modules" / out_path.name
        args = [
            f"-DMHC_SP_OUTPUT={staged}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DMHC_SP_PYTHON_INCLUDE={sysconfig.get_paths()['include']}",
            f"-DMHC_SP_PYBIND11_INCLUDE={pybind11.get_include()}",
            f"-DMHC_SP_TORCH_INCLUDES={';'.join(cpp_extension.include_paths())}",
            f"-DMHC_SP_TORCH_LIB={torch_lib}",
            f"-DMHC_SP_TORCH_VERSION={torch.__version__}",
            f"-DMHC_SP_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DMHC_SP_RUNTIME_LIBSTDCXX={_runtime_libstdcxx()}",
            f"-DCMAKE_BUILD_TYPE={'Debug' if os.environ.get('MHC_SP_DEBUG') == '1' else 'Release'}",
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={_tool('ninja', 'ninja')}",
            f"-DMHC_SP_SANITIZE={sanitize}",
            f"-DMHC_SP_TESTING={'ON' if _testing() else 'OFF'}",
        ]
        if nvcc is not None:
            cuda_home = nvcc.parent.parent
            args += [
                "-DMHC_SP_CUDA=ON",
                f"-DCMAKE_CUDA_COMPILER={nvcc}",
                f"-DCUDAToolkit_ROOT={cuda_home}",
                f"-DMHC_SP_CUDA_ARCHS={_cuda_architectures(arch_list)}",
                # Comma-joined: a ";" would split the C++ definition it becomes (build_info()).
                f"-DMHC_SP_CUDA_ARCH_LIST={','.join(_arch_items(arch_list))}",
            ]
            nccl = _nccl_dirs()
            if nccl is None:
                raise RuntimeError(
                    "CUDA build needs NCCL: pip install nvidia-nccl-cu13 "
                    "(or -cu12 beside a CUDA 12 torch)"
                )
            args += [f"-DMHC_SP_NCCL_INCLUDE={nccl[0]}", f"-DMHC_SP_NCCL_LIB={nccl[1]}"]
        else:
            args.append("-DMHC_SP_CUDA=OFF")
        nvtx = _nvtx_include()
        if nvtx is None:
            print(
                "mhc_sp: building without NVTX ranges (no NVTX v3 headers, or MHC_SP_NVTX=0)",
                file=sys.stderr,
            )
        # Always passed: an empty value clears what an earlier configure cached.
        args.append(f"-DMHC_SP_NVTX_INCLUDE={nvtx or ''}")

        env = dict(os.environ)
        if "MAX_JOBS" in env:
            env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", env["MAX_JOBS"])
        cmake = _tool("cmake", "cmake")
        subprocess.check_call([cmake, "-S", str(ROOT), "-B", str(build_dir), *args], env=env)
        subprocess.check_call([cmake, "--build", str(build_dir)], env=env)
        beside = self._beside(out_path)
        # Test-only modules left in the folder by an earlier testing build are not this build's.
        wanted = [out_path.name, beside[0], *(beside[1:] if _testing() else [])]
        _deliver(staged.parent, out_path.parent, wanted, [out_path.name, *beside])
        cxx_modules = [out_path.name, *beside[1:]]  # the recorder is C
        _check_shared_libstdcxx([out_path.with_name(n) for n in cxx_modules])


setup(
    ext_modules=[CMakeExtension("mhc_sp._C")],
    cmdclass={"build_ext": CMakeBuild},
)
