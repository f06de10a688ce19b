import subprocess
import sys

import pytest

import xpuruntime as xrt
from conftest import requires_gpu


def test_version_and_build_info():
    assert xrt.__version__ == xrt.get_version()
    info = xrt.build_info()
    assert info["version"] == xrt.__version__
    assert isinstance(info["with_cuda"], bool)


def test_all_devices_start_with_the_cpu():
    devices = xrt.get_all_devices()
    assert devices[0] == "cpu"
    assert devices[0].type == "cpu"
    assert devices[0].total_memory > 0
    assert devices[0].sm_count > 0 and devices[0].l2_cache_bytes == 0
    assert len(devices) == xrt.get_device_count() + 1
    assert "Device cpu" in repr(devices[0])


def test_device_construction_and_equality():
    assert xrt.Device("cpu") == xrt.Device("cpu:0") == "cpu"
    assert hash(xrt.Device("cpu")) == hash(xrt.Device("cpu"))
    assert str(xrt.Device("cpu")) == "cpu"
    with pytest.raises(ValueError, match="tpu"):
        xrt.Device("tpu")
    with pytest.raises(xrt.InvalidArgumentError, match="non-negative"):
        xrt.Device("cuda:-2")
    with pytest.raises(TypeError):
        xrt.Device(1.5)


def test_missing_cuda_device_raises_cuda_error_naming_the_reason():
    n = xrt.get_device_count()
    with pytest.raises(xrt.CudaError, match=f"cuda:{n}") as info:
        xrt.Device(f"cuda:{n}")
    assert isinstance(info.value, xrt.XpuRuntimeError)
    if n == 0:
        assert xrt.runtime.cuda_unavailable_reason() in str(info.value)
        assert not xrt.cuda_available()
        assert xrt.get_current_device() == "cpu"
        with pytest.raises(xrt.CudaError):
            xrt.set_current_device("cuda:0")
        with pytest.raises(xrt.CudaError):
            xrt.synchronize("cuda:0")
    xrt.synchronize("cpu")


def test_import_prints_cpu_device_as_the_readme_promises():
    out = subprocess.run(
        [sys.executable, "-c", "import xpuruntime as xrt; print(xrt.get_all_devices())"],
        check=True, capture_output=True, text=True,
    ).stdout
    assert "<Device cpu:" in out


def test_pytorch_submodule_is_lazy():
    code = "import sys, xpuruntime; assert 'torch' not in sys.modules; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout == "ok\n"
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"xpuruntime\[torch\]"):
            import xpuruntime.pytorch  # noqa: F401


@requires_gpu
def test_gpu_device_fields():
    d = xrt.Device(0)
    assert d == "cuda:0" and d.index == 0 and d.type == "cuda"
    major, minor = d.compute_capability
    assert major >= 7
    assert d.supports_fp16 and d.sm_count > 0 and d.total_memory > 2**30 and d.l2_cache_bytes >= 2**20
    assert 0 < d.free_memory <= d.total_memory
    assert d.driver_version > 0 and d.runtime_version > 0
    assert d.supports_bf16 == (major >= 8)
    assert d.supports_fp8 == (major * 10 + minor >= 89)
    xrt.set_current_device(0)
    assert xrt.get_current_device() == "cuda:0"
    d.synchronize()
