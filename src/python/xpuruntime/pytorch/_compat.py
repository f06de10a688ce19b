"""What differs between PyTorch versions, in one place: custom ops, autocast queries, SDPA backends, BLAS choice.

xpuruntime.pytorch targets PyTorch >= 2.4 (``torch.library.custom_op``; ``torch.compile`` needs >= 2.5, where
Dynamo traces torch function modes). Older versions (down to 1.13) still route eager calls, through
``torch.autograd.Function`` instead of custom ops; ``torch.compile`` of routed models is not supported there.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from typing import Iterator, Optional, Tuple

import torch

from .. import _core


def _version(text: str) -> Tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


TORCH_VERSION: Tuple[int, int] = _version(torch.__version__)
#: ``torch.library.custom_op`` with ``register_autograd``/``register_fake`` (PyTorch >= 2.4).
HAS_CUSTOM_OP: bool = TORCH_VERSION >= (2, 4) and hasattr(torch.library, "custom_op")
#: ``torch.compile`` of a model under a routing policy (Dynamo traces torch function modes from 2.5 on).
SUPPORTS_COMPILE: bool = HAS_CUSTOM_OP and TORCH_VERSION >= (2, 5)
_AUTOCAST_BY_DEVICE: bool = TORCH_VERSION >= (2, 4)


def is_compiling() -> bool:
    """True while Dynamo (``torch.compile``) or export traces the calling code."""
    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    return bool(check()) if check is not None else False


def is_traced(tensor: torch.Tensor) -> bool:
    """True for the fake/functional tensors that ``torch.compile`` traces with (no data to hand to xpuruntime)."""
    return type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter)


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast casts to on ``device_type`` when autocast is on there, else None."""
    if _AUTOCAST_BY_DEVICE:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return None


def autocast_cast(tensor: Optional[torch.Tensor], dtype: Optional[torch.dtype]) -> Optional[torch.Tensor]:
    """What autocast does to an input of a lower-precision op: floating tensors other than float64 go to ``dtype``."""
    if tensor is None or dtype is None or not tensor.is_floating_point() or tensor.dtype in (dtype, torch.float64):
        return tensor
    return tensor.to(dtype)


# ---- SDPA backends ----

#: Policy kernel name -> the SDPBackend member name it selects.
SDPA_BACKENDS = {"torch_flash": "FLASH_ATTENTION", "torch_efficient": "EFFICIENT_ATTENTION", "torch_math": "MATH",
                 "torch_cudnn": "CUDNN_ATTENTION"}


def has_sdpa() -> bool:
    return hasattr(torch.nn.functional, "scaled_dot_product_attention")


@contextlib.contextmanager
def sdpa_backend(kernel: str) -> Iterator[None]:
    """Restrict ``F.scaled_dot_product_attention`` to the backend a policy kernel name selects ("torch": no
    restriction)."""
    if kernel == "torch":
        yield
        return
    member = SDPA_BACKENDS[kernel]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # PyTorch 2.0-2.2
        flags = {"enable_flash": member == "FLASH_ATTENTION", "enable_math": member == "MATH",
                 "enable_mem_efficient": member == "EFFICIENT_ATTENTION"}
        with torch.backends.cuda.sdp_kernel(**flags):
            yield
        return
    if not hasattr(SDPBackend, member):
        raise _core.UnsupportedOperationError(
            f"{kernel}: PyTorch {torch.__version__} has no SDPBackend.{member}")
    with sdpa_kernel([getattr(SDPBackend, member)]):
        yield


def _sdpa_params(q, k, v, mask, dropout_p: float, is_causal: bool, enable_gqa: bool):
    params_class = getattr(torch.backends.cuda, "SDPAParams", None)
    if params_class is None:
        return None
    try:
        return params_class(q, k, v, mask, dropout_p, is_causal, enable_gqa)
    except TypeError:  # PyTorch < 2.5: no enable_gqa
        return params_class(q, k, v, mask, dropout_p, is_causal)


def sdpa_support(kernel: str, q, k, v, mask, dropout_p: float, is_causal: bool,
                 enable_gqa: bool) -> Tuple[bool, str]:
    """Whether PyTorch's SDPA backend ``kernel`` can run these inputs, and why not, from PyTorch's own checks
    (``torch.backends.cuda.can_use_*_attention`` with their debug reasons)."""
    if not has_sdpa():
        return False, f"PyTorch {torch.__version__} has no scaled_dot_product_attention (needs >= 2.0)"
    if kernel in ("torch", "torch_math"):
        return True, ""
    if q.device.type != "cuda":
        return False, f"runs on CUDA devices; the call is on {q.device}"
    check_name = {"torch_flash": "can_use_flash_attention", "torch_efficient": "can_use_efficient_attention",
                  "torch_cudnn": "can_use_cudnn_attention"}[kernel]
    check = getattr(torch.backends.cuda, check_name, None)
    params = _sdpa_params(q, k, v, mask, dropout_p, is_causal, enable_gqa)
    if check is None or params is None:
        if kernel == "torch_cudnn":
            return False, f"PyTorch {torch.__version__} cannot tell whether its cuDNN attention runs this call"
        return True, ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = bool(check(params, True))
    if ok:
        return True, ""
    reasons = [str(w.message).strip() for w in caught]
    return False, "; ".join(r for r in reasons if r) or f"torch.backends.cuda.{check_name} says no"


# ---- BLAS library ----

def has_blas_choice() -> bool:
    return hasattr(torch.backends.cuda, "preferred_blas_library")


_BLAS_LIBRARY = {"torch_cublas": "cublas", "torch_cublaslt": "cublaslt"}
_get_blas = getattr(torch._C, "_get_blas_preferred_backend", None)
_set_blas = getattr(torch._C, "_set_blas_preferred_backend", None)
_BLAS_BACKENDS = dict(torch._C._BlasBackend.__members__) if hasattr(torch._C, "_BlasBackend") else {}


class blas_library:  # noqa: N801 - used like the context-manager functions beside it
    """Run PyTorch's GEMMs on the library a policy kernel name selects ("torch_cublas", "torch_cublaslt"; "torch":
    PyTorch's current choice) inside the block. The choice is process-wide in PyTorch; it is switched only when
    another library is in force, through PyTorch's C setters where it has them (this runs in every routed
    backward), and restored on exit."""

    __slots__ = ("backend", "previous")
    _backends: dict = {}  # kernel name -> PyTorch's _BlasBackend member, its library name, or None

    def __init__(self, kernel: str) -> None:
        backend = self._backends.get(kernel, blas_library)
        if backend is blas_library:
            library = _BLAS_LIBRARY.get(kernel)
            backend = None
            if library is not None and has_blas_choice():
                backend = next((m for name, m in _BLAS_BACKENDS.items() if name.lower() == library), library)
            self._backends[kernel] = backend
        self.backend = backend
        self.previous = None

    def _native(self) -> bool:
        return _get_blas is not None and _set_blas is not None and not isinstance(self.backend, str)

    def __enter__(self) -> None:
        backend = self.backend
        if backend is None:
            return
        if not self._native():  # PyTorch's public setter
            self.previous = torch.backends.cuda.preferred_blas_library()
            torch.backends.cuda.preferred_blas_library(backend)
            return
        previous = _get_blas()
        if previous != backend:
            _set_blas(backend)
            self.previous = previous

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            if self._native():
                _set_blas(self.previous)
            else:
                torch.backends.cuda.preferred_blas_library(self.previous)
            self.previous = None


@contextlib.contextmanager
def cudnn_enabled(enabled: bool) -> Iterator[None]:
    """cuDNN on or off for PyTorch's convolutions inside the block."""
    with torch.backends.cudnn.flags(enabled=enabled, benchmark=torch.backends.cudnn.benchmark,
                                    deterministic=torch.backends.cudnn.deterministic,
                                    allow_tf32=torch.backends.cudnn.allow_tf32):
        yield


@contextlib.contextmanager
def tf32(enabled: Optional[bool]) -> Iterator[None]:
    """TF32 for PyTorch's fp32 GEMMs and convolutions on or off inside the block (None: unchanged)."""
    if enabled is None:
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def tf32_allowed(device_type: str) -> bool:
    return device_type == "cuda" and bool(torch.backends.cuda.matmul.allow_tf32)


def kernel_input(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as xpuruntime's kernels take it: contiguous and 16-byte aligned (a copy from torch's allocator when
    it is not). Decisions are made on such inputs too, so that the C++ plan's signature matches every call."""
    if tensor.is_contiguous() and tensor.data_ptr() % 16 == 0:
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def dlpack(tensor: torch.Tensor):
    """A DLPack capsule of ``tensor`` without any stream synchronization (the caller orders the work: xpuruntime
    runs on torch's current stream). ``__dlpack__(stream=...)`` would make the consumer's stream wait, which is
    both needless here and illegal while torch captures a CUDA graph."""
    return torch.utils.dlpack.to_dlpack(tensor.detach())
