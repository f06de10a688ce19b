"""InferenceSession: load an ONNX model, run it through an engine, explain what ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping, Optional, Tuple, Union

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
    engine : {"auto", "onnxruntime", "native", "tensorrt", "openvino", "qnn"}
        ``"auto"`` (default) picks the engine and says why in :meth:`explain`. Engines this build or machine
        lacks raise :class:`~xpuruntime.UnsupportedOperationError` saying what to install. ``backend=`` is the
        same argument under the design's name. ``device="npu"`` raises the same kind of error, naming the NPU
        runtimes (OpenVINO, QNN).
    kernel_policy, exec_policy : KernelPolicy, ExecutionPolicy, optional
        The policies; entries an engine cannot honour are reported by :meth:`explain` (pinned ones are errors).
    fp16 : bool
        Shorthand for ``exec_policy.precision = "fp16"``.
    disabled_passes : list of str, optional
        Native engine: graph passes to turn off by name (``"gemm_fusion"``, ``"attention_fusion"``, ...; see
        docs/native_engine.md). An unknown name raises :class:`~xpuruntime.InvalidArgumentError` listing them.
    external_data_dir : str or Path, optional
        The folder a model's external-data files are read from (default: the model file's folder). A model given as
        bytes reads no file unless this names a folder; locations must stay inside it (no absolute paths, no
        ``..``, no symbolic links out of it).
    optimized_model_path : str or Path, optional
        Native engine: the first run writes its plan's optimized graph there as ONNX, specialised to that run's
        input shapes (fused nodes in the ``com.xpuruntime`` domain; the native engine loads it back). onnxruntime
        engine: ONNX Runtime writes its optimized model there when the session is created.
    session_config : list of (str, str), optional
        onnxruntime engine: ONNX Runtime session config entries, passed as they are (other engines do not read
        them). ``xpuruntime.onnxruntime`` passes ``SessionOptions.add_session_config_entry``'s here.

    Attributes
    ----------
    quantization : QuantizationResult or None
        With ``ExecutionPolicy(precision="int8", calibration=...)``: the QDQ model the session runs and its
        decisions (docs/quantization.md); None otherwise.

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
                 optimized_model_path: Optional[Union[str, Path]] = None, backend: Optional[str] = None,
                 external_data_dir: Optional[Union[str, Path]] = None,
                 session_config: Optional[List[Tuple[str, str]]] = None,
                 **onnxruntime_arguments: Any) -> None:
        if onnxruntime_arguments:
            ort_names = {"sess_options", "providers", "provider_options"}
            if set(onnxruntime_arguments) <= ort_names:
                raise TypeError(f"{', '.join(sorted(onnxruntime_arguments))}: ONNX Runtime's arguments are taken by "
                                "xpuruntime.onnxruntime.InferenceSession (import xpuruntime.onnxruntime as ort; "
                                "docs/engines.md); xpuruntime.InferenceSession takes device= and engine=")
            raise TypeError(f"InferenceSession() got unexpected keyword arguments {sorted(onnxruntime_arguments)}")
        if backend is not None:
            # The design's spelling (backend="openvino"): the engine's other name.
            if engine not in ("auto", backend):
                raise _core.InvalidArgumentError(f"engine={engine!r} and backend={backend!r} disagree: backend is the "
                                                 "engine's other name, give one of them")
            engine = backend
        if isinstance(model, (bytearray, memoryview)):
            model = bytes(model)
        if not isinstance(model, (str, Path, bytes)):
            raise _core.InvalidTypeError(f"model must be a path or bytes, got {type(model).__name__}")
        self.quantization = None
        if getattr(exec_policy, "calibration", None) is not None or getattr(exec_policy, "quantization", None):
            # ExecutionPolicy(precision="int8", calibration=...): the decisions go to the C++ session in the policy,
            # which applies them to the model (docs/quantization.md).
            from ..quantization.session import prepare_session_model

            self.quantization, exec_policy = prepare_session_model(model, exec_policy, device, engine)
        self._session = _core.InferenceSession(model if isinstance(model, bytes) else str(model), device, engine,
                                               kernel_policy, exec_policy, fp16, list(disabled_passes or []),
                                               str(optimized_model_path) if optimized_model_path else "",
                                               str(external_data_dir) if external_data_dir else "",
                                               list(session_config or []))
        self._device = str(device)
        self._made_from = model  # what the session was made of (a path or the caller's bytes: no copy)

    @property
    def engine(self) -> str:
        """The engine that runs this session."""
        return self._session.engine

    def get_inputs(self) -> List[_core.ValueInfo]:
        """The model inputs: ``name``, ``type`` (``"tensor(float32)"``, ``"seq(tensor(int64))"``,
        ``"optional(tensor(float32))"``, ...), ``kind``, ``dtype`` (of the tensor, or of the tensors a sequence or
        optional holds), ``shape`` (symbolic dims as strings)."""
        return self._session.get_inputs()

    def get_outputs(self) -> List[_core.ValueInfo]:
        """The model outputs, as :meth:`get_inputs`."""
        return self._session.get_outputs()

    def run(self, *args, **kwargs):
        """``run(feeds)`` -> ``{name: array}``, or ONNX Runtime's ``run(output_names, feeds)`` -> list of arrays.

        ``feeds`` maps input names to numpy arrays or any DLPack tensor (torch, cupy, xpuruntime), taken
        zero-copy where the engine allows. Outputs on the CPU come back as numpy arrays, device outputs as
        xpuruntime Tensors. bfloat16 outputs, which numpy cannot hold, also come back as xpuruntime Tensors:
        ``t.view("uint16").numpy()`` gives their bit patterns, ``torch.from_dlpack(t)`` a torch tensor; a
        bfloat16 input can be fed as ``xrt.from_numpy(bits).view("bfloat16")`` (``bits`` a uint16 array).

        Sequences and optionals (``get_inputs()[i].type`` ``"seq(tensor(float32))"``,
        ``"optional(tensor(int64))"``, ...) travel as in ONNX Runtime's Python API: a sequence is a list of arrays
        (a list or tuple fed is always a sequence: feeding one to a tensor input raises
        :class:`~xpuruntime.InvalidTypeError`), an empty optional is ``None``, an optional holding a value is that
        value (an array, or a list for a sequence). The native engine runs them on the CPU.

        ``run_options`` (a :class:`~xpuruntime.RunOptions`, keyword or ONNX Runtime's third argument) may stop the
        run: ``terminate`` set from another thread, or its ``timeout``, raise
        :class:`~xpuruntime.RunTerminatedError` / :class:`~xpuruntime.RunTimeoutError` naming where the run stopped.
        Ctrl-C during a run on the main thread raises ``KeyboardInterrupt`` within milliseconds on the CPU
        (docs/reliability.md). The session runs normally afterwards.
        """
        run_options = kwargs.pop("run_options", None)
        if len(args) == 3 and run_options is None:
            args, run_options = args[:2], args[2]
        if len(args) == 1 and not kwargs:
            feeds, names = args[0], None
        elif len(args) == 2 and not kwargs:
            names, feeds = list(args[0] or []) or None, args[1]
            if names is None:  # ONNX Runtime's run(None, feeds): every output, as a list
                names = [o.name for o in self._session.get_outputs()]
        elif not args and "feeds" in kwargs:
            feeds, names = kwargs.pop("feeds"), list(kwargs.pop("output_names", None) or []) or None
            if kwargs:
                raise TypeError(f"run() got unexpected keyword arguments {sorted(kwargs)}")
        else:
            raise TypeError("run() takes feeds (a dict) or (output_names, feeds)")
        if type(feeds) is not dict:
            if not isinstance(feeds, Mapping):
                raise _core.InvalidTypeError(f"feeds must be a dict of input name -> tensor, got "
                                             f"{type(feeds).__name__}")
            feeds = dict(feeds)
        # Note [Python run path] (session_binding.cpp): feeds and outputs are converted in C++.
        return self._session._run_values(feeds, names, run_options)

    def io_binding(self) -> "IOBinding":
        """A new I/O binding for :meth:`run_with_iobinding` (ONNX Runtime's ``io_binding``)."""
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: "IOBinding", run_options: Optional[_core.RunOptions] = None) -> None:
        """Runs with the inputs and outputs bound in ``iobinding``; the outputs are then in
        ``iobinding.get_outputs()``. ``run_options``: a :class:`~xpuruntime.RunOptions`, as in :meth:`run`."""
        if not isinstance(iobinding, IOBinding) or iobinding._session is not self:
            raise _core.InvalidTypeError("run_with_iobinding takes an IOBinding made by this session's io_binding()")
        self._session._run_with_binding(iobinding._binding, run_options)

    def explain(self) -> _core.Explanation:
        """The engine and why, each node's kernel (execution provider), options set and policy notes.
        ``str()`` gives a text report, ``to_json()`` one JSON object."""
        return self._session.explain()

    def __repr__(self) -> str:
        ins = ", ".join(repr(i)[11:-1] for i in self.get_inputs())
        return f"<InferenceSession engine={self.engine} device={self._device} inputs=[{ins}]>"


class IOBinding:
    """Inputs and outputs bound once and reused by :meth:`InferenceSession.run_with_iobinding` (ONNX Runtime's
    IOBinding). An output bound to a tensor is written in place each run (its dtype and shape must be the output's,
    on the session's device); an output bound to a device gets a new tensor there each run. With CUDA graphs, keeping
    the same bound tensors from run to run lets the onnxruntime engine replay its graph over them without copies.

    >>> binding = sess.io_binding()
    >>> binding.bind_input("x", x_cuda)             # any DLPack tensor (torch, cupy, xpuruntime) or numpy array
    >>> binding.bind_output("y", y_cuda)            # written in place
    >>> binding.bind_output("logits", "cuda")       # or: a new tensor on that device each run
    >>> sess.run_with_iobinding(binding)
    >>> y, logits = binding.get_outputs()
    """

    def __init__(self, session: InferenceSession) -> None:
        self._session = session
        self._binding = session._session.io_binding()

    def bind_input(self, name: str, value: Any) -> None:
        """Binds input ``name`` to ``value`` (numpy array or DLPack tensor, taken zero-copy where possible)."""
        self._binding.bind_input(str(name), value)

    def bind_cpu_input(self, name: str, value: Any) -> None:
        """Binds input ``name`` to a numpy array (ONNX Runtime's name for it)."""
        self._binding.bind_input(str(name), np.asarray(value))

    def bind_output(self, name: str, device_type: Any = None, device_id: int = 0) -> None:
        """Binds output ``name``: to a tensor (``bind_output("y", y)``, written in place), or to a device
        (``bind_output("y", "cuda", 0)`` as in ONNX Runtime, or ``"cuda:1"``, a Device; None: the session's)."""
        if device_type is None:
            self._binding.bind_output_device(str(name), self._session._device)
        elif isinstance(device_type, str) or isinstance(device_type, _core.Device):
            device = device_type
            if isinstance(device_type, str) and ":" not in device_type and device_type != "cpu":
                device = f"{device_type}:{int(device_id)}"
            self._binding.bind_output_device(str(name), device)
        else:
            self._binding.bind_output_tensor(str(name), device_type)

    def get_outputs(self) -> List[_core.Tensor]:
        """The outputs of the last run, in binding order (xpuruntime Tensors; DLPack to hand them on)."""
        return list(self._binding.outputs())

    def copy_outputs_to_cpu(self) -> List[np.ndarray]:
        """The outputs of the last run as numpy arrays."""
        return [t.numpy() if t.device.type == "cpu" else t.to("cpu").numpy() for t in self._binding.outputs()]

    def clear_binding_inputs(self) -> None:
        self._binding.clear_inputs()

    def clear_binding_outputs(self) -> None:
        self._binding.clear_outputs()

    def synchronize_inputs(self) -> None:
        """Waits for the work of the session's device (inputs written asynchronously are then complete)."""
        _core.synchronize(self._session._device)

    def synchronize_outputs(self) -> None:
        """Waits for the work of the session's device (outputs are then complete for any reader)."""
        _core.synchronize(self._session._device)
