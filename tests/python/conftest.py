import pathlib

import pytest

import xpuruntime as xrt

requires_gpu = pytest.mark.skipif(
    xrt.get_device_count() == 0, reason=f"needs a CUDA device: {xrt.runtime.cuda_unavailable_reason()}"
)


def _has_torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


requires_torch_gpu = pytest.mark.skipif(
    xrt.get_device_count() == 0 or not _has_torch_cuda(), reason="needs torch with CUDA and a CUDA device"
)


def _has_yaml() -> bool:
    try:
        xrt.KernelPolicy().to_yaml()
    except xrt.UnsupportedOperationError:
        return False
    return True


requires_yaml = pytest.mark.skipif(not _has_yaml(), reason="this build has no yaml-cpp (YAML policy files)")


def has_onnxruntime_engine() -> bool:
    """Whether this build has the onnxruntime engine (ONNX Runtime found at configure time)."""
    model = pathlib.Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny_classifier.onnx"
    try:
        xrt.InferenceSession(model, engine="onnxruntime")
    except xrt.UnsupportedOperationError:
        return False
    return True


requires_ort = pytest.mark.skipif(not has_onnxruntime_engine(), reason="this build has no ONNX Runtime engine")
