"""ONNX Runtime's ``onnxruntime.capi`` layout, so that code importing from it runs on xpuruntime:
``capi.onnxruntime_pybind11_state`` (and its alias ``capi._pybind_state``) hold the exception classes and the
objects ONNX Runtime's C extension exposes; ``capi.onnxruntime_inference_collection`` the session classes and
``check_and_normalize_provider_args``. There is no C extension of ONNX Runtime behind them: each name is
xpuruntime.onnxruntime's own class or function."""
