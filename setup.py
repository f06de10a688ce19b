"""Builds the C++ core and the Python module through CMake for `pip install .` and `pip wheel .` (docs/install.md).

Offline with Debian's build tools: `pip install --no-build-isolation .` (setuptools and wheel from Debian; CMake,
Ninja and the C++ dependencies that scripts/setup.sh installs). The wheel holds the Python package, the module
`xpuruntime._core`, the core library and its CMake package under `xpuruntime/lib` (find_package(xpuruntime) with
`-DCMAKE_PREFIX_PATH=$(python -c "import xpuruntime; print(xpuruntime.cmake_prefix_path())")`), the headers under
`xpuruntime/include`, and ONNX Runtime's library when the build uses it.

Environment:
  XPURT_BUILD_DIR   an already configured build folder to reuse (e.g. `build` from scripts/setup.sh): only built,
                    not reconfigured; default: a temporary folder configured for a release build without tests
  XPURT_CMAKE_ARGS  extra CMake arguments for the default folder

Note [The wheel build leaves the source tree as it was]: everything the build writes (the CMake folder, setuptools'
build folder, the .egg-info metadata) goes into one temporary folder outside the tree, removed when the build ends;
only an XPURT_BUILD_DIR the caller names is kept. ccache (XPURT_USE_CCACHE) keeps a rebuild short.

Note [A wheel without ONNX Runtime]: the onnxruntime engine is built only when CMake finds ONNX Runtime
(scripts/fetch_onnxruntime.sh puts it in .deps/onnxruntime, or -DONNXRUNTIME_ROOT=... in XPURT_CMAKE_ARGS). A wheel
built without it runs every model on the native engine, and its `onnxruntime` engine refuses with what to install;
the build says so in a warning banner after configuring and again at its end (pip shows build output with -v).
"""

import atexit
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext
from setuptools.command.egg_info import egg_info

ROOT = pathlib.Path(__file__).resolve().parent
_SCRATCH = []


def scratch() -> pathlib.Path:
    """This build's temporary folder (Note [The wheel build leaves the source tree as it was])."""
    if not _SCRATCH:
        _SCRATCH.append(pathlib.Path(tempfile.mkdtemp(prefix="xpuruntime-build-")))
        atexit.register(shutil.rmtree, _SCRATCH[0], True)
    return _SCRATCH[0]


def onnxruntime_library(build_dir: pathlib.Path, core: pathlib.Path):
    """The libonnxruntime the core library of `build_dir` links, or None when the build has no ONNX Runtime."""
    try:
        needed = subprocess.run(["readelf", "-d", str(core)], capture_output=True, text=True, check=True).stdout
        linked = "libonnxruntime" in needed
    except (OSError, subprocess.CalledProcessError):
        linked = (build_dir / "src" / "cpp" / "engines" / "onnxruntime").is_dir()
    if not linked:
        return None
    cache = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    match = re.search(r"^ONNXRUNTIME_ROOT:PATH=(.*)$", cache, re.MULTILINE)
    root = pathlib.Path(match.group(1)) if match else ROOT / ".deps" / "onnxruntime"
    for candidate in (root / "lib" / "libonnxruntime.so", root / "lib64" / "libonnxruntime.so"):
        if candidate.exists():
            return candidate.resolve()
    return None


def warn_without_onnxruntime(when: str) -> None:
    """Note [A wheel without ONNX Runtime]: a banner on stderr that no reader of the build log can miss."""
    line = "!" * 100
    print(f"\n{line}\n[xpuruntime] WARNING ({when}): this wheel does NOT carry ONNX Runtime: the onnxruntime engine "
          f"is not built,\n[xpuruntime] `auto` runs every model on the native engine, and engine=\"onnxruntime\" "
          f"refuses with what to install.\n[xpuruntime] To include it: run scripts/fetch_onnxruntime.sh "
          f"(or pass XPURT_CMAKE_ARGS=-DONNXRUNTIME_ROOT=<ONNX Runtime "
          f"1.29+>) and build again (docs/install.md).\n{line}\n", file=sys.stderr, flush=True)


class ScratchBuild(build):
    """setuptools' build folder in the scratch folder, not `build/` of the source tree."""

    def finalize_options(self) -> None:
        self.build_base = str(scratch() / "setuptools")
        super().finalize_options()


class ScratchEggInfo(egg_info):
    """The .egg-info metadata in the scratch folder unless pip names a folder (--egg-base), not in src/python."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self.egg_base = str(scratch())


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def run_command_logged(self, cmd):
        print("[xpuruntime] " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
        subprocess.run([str(c) for c in cmd], check=True)

    def build_extension(self, ext: Extension) -> None:
        reuse = os.environ.get("XPURT_BUILD_DIR")
        build_dir = pathlib.Path(reuse).resolve() if reuse else scratch() / "cmake"
        if not reuse or not (build_dir / "CMakeCache.txt").exists():
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            self.run_command_logged(["cmake", "-S", ROOT, "-B", build_dir, *generator,
                                     f"-DPython3_EXECUTABLE={sys.executable}", "-DCMAKE_BUILD_TYPE=Release",
                                     # the module stays in the build folder, not in the source tree's package
                                     f"-DXPURT_PYTHON_PACKAGE_DIR={build_dir / 'python' / 'xpuruntime'}",
                                     "-DXPURT_BUILD_TESTS=OFF", "-DXPURT_BUILD_BENCHMARKS=OFF",
                                     *shlex.split(os.environ.get("XPURT_CMAKE_ARGS", ""))])
        if not (build_dir / "src" / "cpp" / "engines" / "onnxruntime").is_dir():  # configured without ONNX Runtime
            warn_without_onnxruntime("after configuring")
        self.run_command_logged(["cmake", "--build", build_dir, "-j", str(os.cpu_count() or 2)])
        stage = pathlib.Path(self.build_temp).resolve() / "stage"
        shutil.rmtree(stage, ignore_errors=True)
        self.run_command_logged(["cmake", "--install", build_dir, "--prefix", stage, "--strip"])
        package = pathlib.Path(self.get_ext_fullpath(ext.name)).parent
        package.mkdir(parents=True, exist_ok=True)
        for module in (stage / "python" / "xpuruntime").glob("_core*.so"):
            shutil.copy2(module, package / module.name)
        lib_src = next(p for p in (stage / "lib", stage / "lib64") if p.exists())
        shutil.rmtree(package / "lib", ignore_errors=True)
        # Wheels hold no symbolic links: the library once, under its soname (what the loader looks for), and the
        # CMake package's targets pointed at that name.
        for lib in lib_src.iterdir():
            if lib.is_dir():
                shutil.copytree(lib, package / "lib" / lib.name)
        real = max(lib_src.glob("libxpuruntime_core.so*"), key=lambda p: len(p.name))
        (package / "lib").mkdir(exist_ok=True)
        shutil.copy2(real, package / "lib" / "libxpuruntime_core.so.0")
        for cmake_file in (package / "lib" / "cmake" / "xpuruntime").glob("xpuruntimeTargets-*.cmake"):
            cmake_file.write_text(cmake_file.read_text().replace(real.name, "libxpuruntime_core.so.0"))
        shutil.rmtree(package / "include", ignore_errors=True)
        shutil.copytree(stage / "include", package / "include")
        # xpuruntime.pytorch compiles its native routing path against the user's PyTorch on first use.
        shutil.copy2(ROOT / "src" / "cpp" / "bindings" / "torch" / "routing_native.cpp",
                     package / "pytorch" / "routing_native.cpp")
        ort = onnxruntime_library(build_dir, real)
        if ort is None:
            warn_without_onnxruntime("at the end of the build")
            return
        print(f"[xpuruntime] the wheel carries ONNX Runtime: {ort}", flush=True)
        shutil.copy2(ort, package / "lib" / "libonnxruntime.so.1")
        shared = ort.parent / "libonnxruntime_providers_shared.so"
        if shared.exists():
            shutil.copy2(shared, package / "lib" / shared.name)


if __name__ == "__main__":  # pip's backend runs this file as __main__; tests import its helpers
    setup(ext_modules=[CMakeExtension("xpuruntime._core")],
          cmdclass={"build_ext": CMakeBuild, "build": ScratchBuild, "egg_info": ScratchEggInfo})
