"""InferenceSession: load an ONNX model, run it through an engine, explain what ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from .. import _core


class InferenceSession:
    """Runs an ONNX model.

    Parameters
    ----------
    model : str, Path or bytes
        A model file (external-data files next to it) or the serialized model.
    device : str or Device
        ``"cpu"`` (default) or ``"cuda:N"``.
    engine : {"auto", "onnxruntime", "native", "tensorrt"}
        ``"auto"`` (default) picks the engine and says why in :meth:`explain`. Engines this build or machine
        lacks raise :class:`~xpuruntime.UnsupportedOperationError` saying what to install.
    kernel_policy, exec_policy : KernelPolicy, ExecutionPolicy, optional
        The policies; entries an engine cannot honour are reported by :meth:`explain` (pinned ones are errors).
    fp16 : bool
        Shorthand for ``exec_policy.precision = "fp16"``.
    disabled_passes : list of str, optional
        Native engine: graph passes to turn off by name (``"gemm_fusion"``, ``"attention_fusion"``, ...; see
        docs/native_engine.md). An unknown name raises :class:`~xpuruntime.InvalidArgumentError` listing them.
    optimized_model_path : str or Path, optional
        Native engine: the first run writes its plan's optimized graph there as ONNX, specialised to that run's
        input shapes (fused nodes in the ``com.xpuruntime`` domain; the native engine loads it back).

    Examples
    --------
    >>> sess = xrt.InferenceSession("model.onnx")
    >>> outputs = sess.run({"x": x})                 # {name: numpy array}
    >>> y, = sess.run(["y"], {"x": x})               # ONNX Runtime style: a list
    >>> print(sess.explain())
    """

    def __init__(self, model: Union[str, Path, bytes], device: Any = "cpu", engine: str = "auto",
                 kernel_policy: Optional[_core.KernelPolicy] = None,
                 exec_policy: Optional[_core.ExecutionPolicy] = None, fp16: bool = False,
                 disabled_passes: Optional[List[str]] = None,
                 optimized_model_path: Optional[Union[str, Path]] = None) -> None:
        if isinstance(model, (bytearray, memoryview)):
            model = bytes(model)
        if not isinstance(model, (str, Path, bytes)):
            raise _core.InvalidTypeError(f"model must be a path or bytes, got {type(model).__name__}")
        self._session = _core.InferenceSession(model if isinstance(model, bytes) else str(model), device, engine,
                                               kernel_policy, exec_policy, fp16, list(disabled_passes or []),
                                               str(optimized_model_path) if optimized_model_path else "")
        self._device = str(device)

    @property
    def engine(self) -> str:
        """The engine that runs this session."""
        return self._session.engine

    def get_inputs(self) -> List[_core.ValueInfo]:
        """The model inputs: ``name``, ``dtype``/``type``, ``shape`` (symbolic dims as strings)."""
        return self._session.get_inputs()

    def get_outputs(self) -> List[_core.ValueInfo]:
        """The model outputs, as :meth:`get_inputs`."""
        return self._session.get_outputs()

    def run(self, *args, **kwargs):
        """``run(feeds)`` -> ``{name: array}``, or ONNX Runtime's ``run(output_names, feeds)`` -> list of arrays.

        ``feeds`` maps input names to numpy arrays or any DLPack tensor (torch, cupy, xpuruntime), taken
        zero-copy where the engine allows. Outputs on the CPU come back as numpy arrays, device outputs as
        xpuruntime Tensors.
        """
        if len(args) == 1 and not kwargs and isinstance(args[0], Mapping):
            feeds, names, as_dict = args[0], [], True
        elif len(args) == 2 and not kwargs:
            names, feeds, as_dict = list(args[0] or []), args[1], False
        elif not args and "feeds" in kwargs:
            feeds, names = kwargs.pop("feeds"), list(kwargs.pop("output_names", None) or [])
            as_dict = not names
            if kwargs:
                raise TypeError(f"run() got unexpected keyword arguments {sorted(kwargs)}")
        else:
            raise TypeError("run() takes feeds (a dict) or (output_names, feeds)")
        if not isinstance(feeds, Mapping):
            raise _core.InvalidTypeError(f"feeds must be a dict of input name -> tensor, got {type(feeds).__name__}")
        outputs = self._session._run([(str(k), _as_tensor(v)) for k, v in feeds.items()], names)
        values = [_to_user(t) for t in outputs]
        if as_dict:
            names = names or [o.name for o in self.get_outputs()]
            return dict(zip(names, values))
        return values

    def explain(self) -> _core.Explanation:
        """The engine and why, each node's kernel (execution provider), options set and policy notes.
        ``str()`` gives a text report, ``to_json()`` one JSON object."""
        return self._session.explain()

    def __repr__(self) -> str:
        ins = ", ".join(repr(i)[11:-1] for i in self.get_inputs())
        return f"<InferenceSession engine={self.engine} device={self._device} inputs=[{ins}]>"


def _as_tensor(value: Any):
    if isinstance(value, (_core.Tensor, np.ndarray)) or hasattr(value, "__dlpack__"):
        if isinstance(value, np.ndarray) and not value.flags.c_contiguous:
            value = np.ascontiguousarray(value)
        return value
    return np.asarray(value)


def _to_user(tensor: _core.Tensor):
    return tensor.numpy() if tensor.device.type == "cpu" else tensor
