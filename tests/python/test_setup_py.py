"""setup.py's helpers (scripts/test_wheel.sh builds and installs the wheel itself): where the build writes (outside
the source tree), how it tells whether the core it built links ONNX Runtime, and the warning a wheel without it
prints (Note [A wheel without ONNX Runtime])."""

import importlib.util
import pathlib
import shutil

import pytest

import xpuruntime as xrt

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup_py():
    spec = importlib.util.spec_from_file_location("xpuruntime_setup_py", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup() does not run
    return module


def test_the_build_writes_outside_the_source_tree(setup_py):
    scratch = setup_py.scratch()
    assert scratch.is_dir() and ROOT not in scratch.parents
    assert setup_py.scratch() == scratch  # one folder per build


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) is not installed")
def test_onnxruntime_is_found_only_in_a_core_that_links_it(setup_py, tmp_path):
    modules = sorted(pathlib.Path(xrt.__file__).parent.glob("_core*.so"))
    if not modules:
        pytest.skip("the module is not in the source tree's package")
    core = modules[0]
    build = tmp_path / "build"
    build.mkdir()
    (build / "CMakeCache.txt").write_text(f"ONNXRUNTIME_ROOT:PATH={ROOT / '.deps' / 'onnxruntime'}\n")
    # the Python module links the core library, not ONNX Runtime
    assert setup_py.onnxruntime_library(build, core) is None
    libcore = ROOT / "build" / "src" / "cpp" / "libxpuruntime_core.so"
    if "onnxruntime" in xrt.available_engines() and libcore.exists():
        found = setup_py.onnxruntime_library(build, libcore)
        assert found is not None and found.name.startswith("libonnxruntime.so")


def test_a_wheel_without_onnxruntime_says_so_loudly(setup_py, capsys):
    setup_py.warn_without_onnxruntime("at the end of the build")
    err = capsys.readouterr().err
    # the line scripts/test_wheel.sh looks for, and what to do about it
    assert "WARNING (at the end of the build): this wheel does NOT carry ONNX Runtime" in err
    assert "scripts/fetch_onnxruntime.sh" in err and (ROOT / "scripts" / "fetch_onnxruntime.sh").exists()
    assert err.count("!" * 100) == 2
