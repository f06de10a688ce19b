"""capture_graph: CUDA graphs of a model's forward or of a whole training step, by PyTorch's rules.

Note [Capturing under a kernel policy]
PyTorch's rules for ``torch.cuda.graph`` are: warm up on a side stream first (lazy initialization, cuBLAS
workspaces, autotuning and optimizer state must not happen inside the capture); capture into a private memory pool;
feed new data by copying it into the same (static) input tensors; read results from the same (static) outputs. Routed
calls add one rule of their own: each call signature is decided (and its xpuruntime plan built) on its first call,
which must therefore come before the capture; the warm-up does it. Inside the capture an xpuruntime kernel allocates
its outputs and workspace with torch (the graph's pool) and launches on the capture stream (Note [Running an
xpuruntime kernel inside PyTorch]), so it replays like any PyTorch kernel.
"""

from __future__ import annotations

import warnings

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import _core

_HINT = ("CUDA graphs cannot capture host synchronizations (.item(), .cpu(), printing or testing a tensor's value), "
         "CPU tensors, shapes or control flow that depend on data, or optimizers without capturable=True (Adam, "
         "AdamW); each call must run the same kernels on the same memory every time")


def _cuda_device(tensors: Sequence[torch.Tensor], what: str) -> torch.device:
    if not torch.cuda.is_available():
        raise _core.UnsupportedOperationError(f"{what}: CUDA graphs need a CUDA device, and PyTorch sees none")
    devices = {t.device for t in tensors}
    cpu = [t for t in tensors if t.device.type != "cuda"]
    if cpu:
        raise _core.UnsupportedOperationError(
            f"{what}: every input must be a CUDA tensor (a graph replays device work only), but got one on "
            f"{cpu[0].device} of shape {list(cpu[0].shape)}; move it with .cuda() first")
    if len(devices) > 1:
        raise _core.UnsupportedOperationError(f"{what}: inputs on several devices ({sorted(map(str, devices))}); "
                                              "one graph runs on one device")
    return next(iter(devices)) if devices else torch.device("cuda", torch.cuda.current_device())


def _flatten(args: Sequence[Any], kwargs: Dict[str, Any]) -> List[Tuple[Any, Any]]:
    """(path, value) of every argument, tensors included, in a stable order."""
    items = [(i, a) for i, a in enumerate(args)] + sorted(kwargs.items())
    return items


def _static_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        copy.requires_grad_(value.requires_grad)
        return copy
    return value


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class CapturedGraph:
    """``fn`` captured into a CUDA graph, with static input buffers. Made by :func:`capture_graph`.

    Calling it copies the given tensors into the static inputs (same shapes, dtypes and device as the sample
    arguments; other arguments must equal the sample's), replays the graph and returns the static outputs: the same
    tensors every call, overwritten by the next replay (``.clone()`` what you keep).

    Attributes
    ----------
    graph : torch.cuda.CUDAGraph
    static_args, static_kwargs : the input buffers
    static_outputs : what ``fn`` returned during the capture
    """

    def __init__(self, fn: Callable, args: Sequence[Any], kwargs: Dict[str, Any], warmup: int, pool: Any,
                 stream: Optional["torch.cuda.Stream"]) -> None:
        name = f"capture_graph({_name(fn)})"
        if warmup < 1:
            raise _core.InvalidArgumentError(f"{name}: warmup must be >= 1 (the first calls choose kernels, build "
                                             f"plans and create optimizer state, which a capture cannot), got {warmup}")
        tensors = [v for _, v in _flatten(args, kwargs) if isinstance(v, torch.Tensor)]
        self.device = _cuda_device(tensors, name)
        self.fn = fn
        self.static_args = tuple(_static_copy(a) for a in args)
        self.static_kwargs = {k: _static_copy(v) for k, v in kwargs.items()}
        self._name = name
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn(*self.static_args, **self.static_kwargs)
        current.wait_stream(side)
        capture = GraphCapture(pool=pool, stream=stream, name=name)
        with capture:
            self.static_outputs = fn(*self.static_args, **self.static_kwargs)
        self.graph = capture.graph

    @property
    def pool(self) -> Any:
        """The graph's memory pool handle (share it with ``capture_graph(..., pool=...)``)."""
        return self.graph.pool()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._copy_inputs(args, kwargs)
        self.graph.replay()
        return self.static_outputs

    def replay(self) -> Any:
        """Replay on the current static inputs; returns the static outputs."""
        self.graph.replay()
        return self.static_outputs

    def _copy_inputs(self, args: Sequence[Any], kwargs: Dict[str, Any]) -> None:
        if len(args) != len(self.static_args) or set(kwargs) != set(self.static_kwargs):
            raise _core.InvalidArgumentError(
                f"{self._name}: expected {len(self.static_args)} positional argument(s) and keyword(s) "
                f"{sorted(self.static_kwargs)}, as captured; got {len(args)} and {sorted(kwargs)}")
        for (key, static), (_, given) in zip(_flatten(self.static_args, self.static_kwargs), _flatten(args, kwargs)):
            label = f"argument {key}" if isinstance(key, int) else f"argument '{key}'"
            if isinstance(static, torch.Tensor):
                if not isinstance(given, torch.Tensor):
                    raise _core.InvalidTypeError(f"{self._name}: {label} must be a tensor, got {type(given).__name__}")
                if given.shape != static.shape or given.dtype != static.dtype:
                    raise _core.InvalidArgumentError(
                        f"{self._name}: expected {label} of shape {list(static.shape)} ({static.dtype}) as captured, "
                        f"but got {list(given.shape)} ({given.dtype}); capture another graph for other shapes")
                if given is not static:
                    static.copy_(given)
            elif given is not static and given != static:
                raise _core.InvalidArgumentError(
                    f"{self._name}: {label} was {static!r} when captured and is {given!r} now; non-tensor arguments "
                    "are baked into the graph")

    def __repr__(self) -> str:
        return f"<CapturedGraph {self._name} on {self.device}>"


def _recover_after_failed_capture() -> None:
    """A capture that fails midway never runs PyTorch's capture epilogue, so its CUDA RNG stays in capture mode and
    every later random op raises "Offset increment outside graph capture encountered unexpectedly". An empty capture
    on a side stream runs the prologue/epilogue pair again and leaves the generator as it was before the capture."""
    try:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the CUDA graph is empty"
            with torch.cuda.stream(side):
                graph.capture_begin()
                graph.capture_end()
        del graph
    except RuntimeError:  # nothing more can be done; the original error is the one reported
        pass


class GraphCapture:
    """The context-manager form of :func:`capture_graph`: captures the block into ``self.graph``.

    The block must have run before (warm-up: kernel decisions, plans, optimizer state), and its inputs must be
    tensors it will find again at replay (fill them with ``copy_``). ``replay()`` runs the captured work.
    """

    def __init__(self, pool: Any = None, stream: Optional["torch.cuda.Stream"] = None,
                 name: str = "capture_graph()") -> None:
        self.graph = torch.cuda.CUDAGraph() if torch.cuda.is_available() else None
        self._pool = pool
        self._stream = stream
        self._name = name
        self._context: Any = None

    def __enter__(self) -> "GraphCapture":
        if self.graph is None:
            raise _core.UnsupportedOperationError(f"{self._name}: CUDA graphs need a CUDA device, and PyTorch sees "
                                                  "none")
        self._context = torch.cuda.graph(self.graph, pool=self._pool, stream=self._stream)
        self._context.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        context, self._context = self._context, None
        try:
            context.__exit__(exc_type, exc, tb)
        except RuntimeError as error:
            _recover_after_failed_capture()
            if exc is None:
                raise _core.UnsupportedOperationError(f"{self._name}: the capture failed: {error}. {_HINT}") from error
            # Ending a capture the block broke fails too; the block's own error says more.
        if exc is not None:
            _recover_after_failed_capture()
        if isinstance(exc, RuntimeError) and not isinstance(exc, _core.XpuRuntimeError):
            raise _core.UnsupportedOperationError(f"{self._name}: the capture failed: {exc}. {_HINT}") from exc

    @property
    def pool(self) -> Any:
        return self.graph.pool()

    def replay(self) -> None:
        self.graph.replay()

    def __repr__(self) -> str:
        return "<GraphCapture>"


def capture_graph(fn: Optional[Callable] = None, *sample_args: Any, warmup: int = 3, pool: Any = None,
                  stream: Optional["torch.cuda.Stream"] = None, autograd: bool = False, **sample_kwargs: Any):
    """Capture a model's forward, or a whole training step, into a CUDA graph.

    ``capture_graph(fn, *sample_args, **sample_kwargs)`` copies the sample arguments into static buffers, runs
    ``fn`` ``warmup`` times on a side stream (real calls: a training step updates the model each time), captures one
    call into a graph with a private memory pool (or ``pool``) and returns a :class:`CapturedGraph`; calling that
    copies new inputs in, replays and returns the static outputs. ``fn`` may do everything a step does: forward,
    ``loss.backward()``, ``optimizer.step()`` (with ``capturable=True`` for Adam/AdamW) and
    ``optimizer.zero_grad(set_to_none=False)`` (in place, so every replay starts from zero gradients in the same
    memory).

    ``capture_graph(module, *sample_args, autograd=True)`` graphs the forward and the backward of ``module``
    separately (``torch.cuda.make_graphed_callables``) and returns a callable to use inside an eager training loop;
    sample tensors that require grad mark the inputs to differentiate.

    ``capture_graph()`` without ``fn`` is a context manager (:class:`GraphCapture`) that captures its block; warm
    the block up yourself first.

    Routed calls (see :func:`set_kernel_policy`) are captured like any PyTorch work: their kernels and plans are
    chosen during the warm-up (Note [Capturing under a kernel policy]).

    Raises
    ------
    UnsupportedOperationError
        No CUDA device, CPU inputs, or a capture PyTorch refused (the message says what cannot be captured).
    InvalidArgumentError
        ``warmup < 1``; at replay, inputs whose shapes or dtypes differ from the sample's.
    """
    if fn is None:
        if sample_args or sample_kwargs or autograd:
            raise _core.InvalidArgumentError("capture_graph(): arguments without a function to capture")
        return GraphCapture(pool=pool, stream=stream)
    if not callable(fn):
        raise _core.InvalidTypeError(f"capture_graph: fn must be callable, got {type(fn).__name__}")
    if autograd:
        if sample_kwargs:
            raise _core.InvalidArgumentError("capture_graph(autograd=True) takes positional tensor arguments only "
                                             "(torch.cuda.make_graphed_callables)")
        _cuda_device([a for a in sample_args if isinstance(a, torch.Tensor)], f"capture_graph({_name(fn)})")
        if not all(isinstance(a, torch.Tensor) for a in sample_args):
            raise _core.InvalidTypeError("capture_graph(autograd=True): every sample argument must be a tensor")
        try:
            options = {"pool": pool} if pool is not None else {}
            return torch.cuda.make_graphed_callables(fn, tuple(sample_args), num_warmup_iters=warmup, **options)
        except RuntimeError as error:
            _recover_after_failed_capture()
            raise _core.UnsupportedOperationError(
                f"capture_graph({_name(fn)}, autograd=True): the capture failed: {error}. {_HINT}") from error
    return CapturedGraph(fn, sample_args, sample_kwargs, warmup, pool, stream)
