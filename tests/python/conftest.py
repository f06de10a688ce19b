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
