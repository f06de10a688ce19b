"""Builds the C++ core and the Python module through CMake for `pip install .` and `pip wheel .` (docs/install.md).

Offline with Debian's build tools: `pip install --no-build-isolation .` (setuptools and wheel from Debian; CMake,
Ninja and the C++ dependencies that scripts/setup.sh installs). The wheel holds the Python package, the module
`xpuruntime._core`, the core library and its CMake package under `xpuruntime/lib` (find_package(xpuruntime) with
`-DCMAKE_PREFIX_PATH=$(python -c "import xpuruntime; print(xpuruntime.cmake_prefix_path())")`), the headers under
`xpuruntime/include`, and ONNX Runtime's library when the build uses it.

Environment:
  XPURT_BUILD_DIR   an already configured build folder to reuse (e.g. `build` from scripts/setup.sh): only built,
                    not reconfigured; default: a folder `build-pip` configured for a release build without tests
  XPURT_CMAKE_ARGS  extra CMake arguments for the default folder
"""

import os
import pathlib
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def run_command_logged(self, cmd):
        print("[xpuruntime] " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
        subprocess.run([str(c) for c in cmd], check=True)

    def build_extension(self, ext: Extension) -> None:
        reuse = os.environ.get("XPURT_BUILD_DIR")
        build_dir = pathlib.Path(reuse).resolve() if reuse else ROOT / "build-pip"
        if not reuse or not (build_dir / "CMakeCache.txt").exists():
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            self.run_command_logged(["cmake", "-S", ROOT, "-B", build_dir, *generator,
                                     f"-DPython3_EXECUTABLE={sys.executable}", "-DCMAKE_BUILD_TYPE=Release",
                                     # the module stays in the build folder, not in the source tree's package
                                     f"-DXPURT_PYTHON_PACKAGE_DIR={build_dir / 'python' / 'xpuruntime'}",
                                     "-DXPURT_BUILD_TESTS=OFF", "-DXPURT_BUILD_BENCHMARKS=OFF",
                                     *shlex.split(os.environ.get("XPURT_CMAKE_ARGS", ""))])
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
        ort = ROOT / ".deps" / "onnxruntime" / "lib" / "libonnxruntime.so"
        if ort.exists():
            shutil.copy2(ort, package / "lib" / "libonnxruntime.so.1")
            shared = ort.parent / "libonnxruntime_providers_shared.so"
            if shared.exists():
                shutil.copy2(shared, package / "lib" / shared.name)


setup(ext_modules=[CMakeExtension("xpuruntime._core")], cmdclass={"build_ext": CMakeBuild})
