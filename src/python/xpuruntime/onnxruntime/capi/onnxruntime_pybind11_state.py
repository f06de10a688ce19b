"""ONNX Runtime's C-extension module, as xpuruntime provides it: the exception classes (``Fail``,
``InvalidArgument``, ... which are also xpuruntime's typed errors: Note [Two names for one error] in
xpuruntime/onnxruntime/_errors.py) and the classes and functions ONNX Runtime's extension exposes, which here are
``xpuruntime.onnxruntime``'s own."""

from __future__ import annotations

import ctypes
from typing import Any

from .. import (GraphOptimizationLevel, ExecutionMode, ExecutionOrder, ModelMetadata, NodeArg, OrtAllocatorType,
                OrtArenaCfg, OrtDevice, OrtMemoryInfo, OrtMemType, OrtSparseFormat, OrtValue, OrtValueVector,
                RunOptions, SessionOptions, SparseTensor, create_and_register_allocator,
                create_and_register_allocator_v2, get_all_providers, get_available_providers, get_build_info,
                get_device, get_version_string, set_default_logger_severity, set_default_logger_verbosity, set_seed)
from .._errors import (EngineError, EPFail, Fail, InvalidArgument, InvalidGraph, InvalidProtobuf, ModelLoaded,
                       ModelRequiresCompilation, NoModel, NoSuchFile, NotImplemented, RuntimeException)

__all__ = [
    "Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException", "InvalidProtobuf",
    "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail", "ModelRequiresCompilation",
    "OrtValue", "OrtValueVector", "RunOptions", "SessionOptions", "SparseTensor", "OrtDevice", "OrtMemoryInfo",
    "OrtArenaCfg", "OrtAllocatorType", "OrtMemType", "OrtSparseFormat", "GraphOptimizationLevel", "ExecutionMode",
    "ExecutionOrder", "ModelMetadata", "NodeArg", "get_default_session_options", "is_dlpack_uint8_tensor",
    "get_all_providers", "get_available_providers", "get_build_info", "get_device", "get_version_string",
    "set_default_logger_severity", "set_default_logger_verbosity", "set_seed", "create_and_register_allocator",
    "create_and_register_allocator_v2",
]


def get_default_session_options() -> SessionOptions:
    """A new SessionOptions with ONNX Runtime's defaults."""
    return SessionOptions()


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType)]


def is_dlpack_uint8_tensor(capsule: Any) -> bool:
    """Whether a DLPack capsule (``"dltensor"``, not yet consumed) holds uint8 elements (DLPack code kDLUInt, 8
    bits). The capsule is only read."""
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    if get_name(capsule) != b"dltensor":
        raise InvalidArgument("is_dlpack_uint8_tensor takes an unconsumed DLPack capsule ('dltensor')")
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    tensor = _DLTensor.from_address(get_pointer(capsule, b"dltensor"))  # DLManagedTensor starts with its DLTensor
    return tensor.dtype.code == 1 and tensor.dtype.bits == 8
