"""ONNX Runtime's ``capi._pybind_state``: the same names as ``capi.onnxruntime_pybind11_state``."""

from .onnxruntime_pybind11_state import *  # noqa: F401,F403
from .onnxruntime_pybind11_state import __all__  # noqa: F401
