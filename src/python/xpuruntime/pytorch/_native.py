"""The native path of the routing mode (Note [The native path] in src/cpp/bindings/torch/routing_native.cpp):
building and loading its PyTorch extension, and registering call sites with it.

The extension is compiled against the PyTorch in use with ``torch.utils.cpp_extension`` the first time routing is
turned on (a C++ compiler and PyTorch's headers are needed; about 20 to 60 seconds, once per PyTorch version and
source: the build is cached under ``$XPURUNTIME_CACHE_DIR`` or ``~/.cache/xpuruntime``). Where it cannot be built
(no compiler or headers, an installed package without the source) routing runs on the Python path, with the same
decisions and results, and :func:`status` says why. ``XPURUNTIME_TORCH_NATIVE=0`` (or :func:`set_enabled`) keeps
routing on the Python path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from .. import _core

# Installed from a wheel the source sits beside this file (setup.py puts it there); in the source tree it is in
# src/cpp/bindings/torch.
_PACKAGED = Path(__file__).resolve().parent / "routing_native.cpp"
SOURCE = _PACKAGED if _PACKAGED.exists() else (
    Path(__file__).resolve().parents[3] / "cpp" / "bindings" / "torch" / "routing_native.cpp")

MODULE: Any = None  # the loaded extension, or None
DISPATCH: Any = None  # its dispatch function (bound to the routing mode) while the native path is on, else None
HAS_CUDA = False  # whether the extension was built with CUDA (it launches on torch's current CUDA stream)
_status: Dict[str, Any] = {"enabled": os.environ.get("XPURUNTIME_TORCH_NATIVE", "1") not in ("0", "off", "false"),
                           "loaded": False, "reason": "not built yet: it is built when routing is first turned on",
                           "path": None, "cuda": False}
_tried = False
_lock = threading.Lock()
_PRECISION_TOKENS: Dict[Optional[str], int] = {None: 0}


def _torch_version() -> int:
    major, minor = torch.__version__.split(".")[:2]
    return int(major) * 100 + int("".join(c for c in minor if c.isdigit()) or 0)


def _build_dir() -> Path:
    root = os.environ.get("XPURUNTIME_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "xpuruntime")
    return Path(root) / "torch_native"


def _with_cuda() -> bool:
    if torch.version.cuda is None:
        return False
    from torch.utils import cpp_extension

    return cpp_extension.CUDA_HOME is not None


def _load() -> Any:
    """The extension, built first where needed (cached by PyTorch version, build flags and source)."""
    source = SOURCE.read_bytes()
    cuda = _with_cuda()
    flags = ["-O2", f"-DXRT_TORCH_VERSION={_torch_version()}"] + (["-DXRT_TORCH_CUDA"] if cuda else [])
    digest = hashlib.sha256(source + repr((torch.__version__, sys.version, flags)).encode()).hexdigest()[:16]
    name = f"xpuruntime_torch_native_{digest}"
    directory = _build_dir() / name
    built = directory / f"{name}.so"
    if built.exists():
        spec = importlib.util.spec_from_file_location(name, built)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    else:
        from torch.utils import cpp_extension

        directory.mkdir(parents=True, exist_ok=True)
        print(f"[xpuruntime] building the native PyTorch routing path in {directory} (once)", file=sys.stderr)
        module = cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=flags, with_cuda=cuda,
                                    build_directory=str(directory), verbose=False)
    _status["path"] = str(built)
    return module, cuda


def _error(code: int, message: str) -> Exception:
    classes = {1: _core.XpuRuntimeError, 2: _core.CudaError, 3: _core.OutOfMemoryError,
               4: _core.UnsupportedOperationError, 5: _core.InvalidArgumentError, 6: _core.InvalidTypeError}
    return classes.get(code, _core.XpuRuntimeError)(message)


def ensure_loaded() -> None:
    """Build and load the extension once (when enabled); on failure the Python path stays, with the reason."""
    global _tried, MODULE, HAS_CUDA
    if _tried or not _status["enabled"]:
        return
    with _lock:
        if _tried:
            return
        _tried = True
        if not SOURCE.exists():
            _status["reason"] = f"its source is not installed ({SOURCE}): run xpuruntime from its source tree"
            return
        try:
            module, cuda = _load()
        except Exception as error:  # noqa: BLE001 - any build or load failure: the Python path stays
            reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
            _status["reason"] = f"could not be built or loaded ({type(error).__name__}: {reason})"
            warnings.warn(f"xpuruntime.pytorch: the native routing path {_status['reason']}; routing runs on the "
                          "Python path (same kernels and decisions, more host time per call)", RuntimeWarning,
                          stacklevel=3)
            return
        hooks = _install_compile_hooks()
        if hooks is not None:
            _status["reason"] = f"off: {hooks}, so torch.compile could not trace the routing mode"
            return
        from . import _mode

        module.configure(list(_mode._HANDLERS), _mode._MODE._torch_function_py, _error, torch.nn.Parameter)
        MODULE, HAS_CUDA = module, cuda
        _status.update(loaded=True, reason="loaded", cuda=cuda)
        _switch()


def _switch() -> None:
    global DISPATCH
    if MODULE is not None and _status["enabled"]:
        from . import _mode

        DISPATCH = MODULE.bind(_mode._MODE)
    else:
        DISPATCH = None
    _attach()
    sync_state()


# Note [The native handler and torch.compile]
# PyTorch calls a mode's ``__torch_function__`` attribute, which must be a method of the mode (its __self__ the
# mode). The native handler is installed as that attribute on the mode object itself (the class keeps the Python
# method), so that eager calls reach C directly. Dynamo, which traces the mode's handler, must see the Python
# method: while it compiles a frame (its compile start/end callbacks) the attribute is removed, and put back
# after. On a PyTorch with Dynamo but without those callbacks the native path stays off.
_compiling_depth = 0


def _attach() -> None:
    from . import _mode

    if DISPATCH is not None and _compiling_depth == 0:
        _mode._MODE.__dict__["__torch_function__"] = DISPATCH
    else:
        _mode._MODE.__dict__.pop("__torch_function__", None)


def _compile_started(*_: Any) -> None:
    global _compiling_depth
    _compiling_depth += 1
    _attach()


def _compile_ended(*_: Any) -> None:
    global _compiling_depth
    _compiling_depth = max(0, _compiling_depth - 1)
    _attach()


def _install_compile_hooks() -> Optional[str]:
    """None when Dynamo will see the Python handler while it compiles (or PyTorch has no Dynamo), else why not."""
    if _torch_version() < 200:
        return None
    try:
        from torch._dynamo.callback import callback_handler
    except Exception as error:  # noqa: BLE001 - no usable Dynamo: torch.compile cannot trace the mode anyway
        return f"torch._dynamo's compile callbacks are unavailable ({type(error).__name__})"
    callback_handler.register_start_callback(_compile_started)
    callback_handler.register_end_callback(_compile_ended)
    return None


def set_enabled(enabled: bool) -> None:
    """Turn the native path on (building it if needed) or off (routing on the Python path)."""
    _status["enabled"] = bool(enabled)
    if enabled:
        ensure_loaded()
    _switch()


def status() -> Dict[str, Any]:
    """``{"enabled", "loaded", "active", "reason", "path", "cuda", "calls"}``: whether routed calls take the native
    path, and (``calls``) how many did, or went to Python and why, since the process started."""
    calls = MODULE.stats() if MODULE is not None else {}
    return dict(_status, active=DISPATCH is not None, calls=calls)


def sync_state() -> None:
    """Tell the extension the current scope and precision override (the parts of a call's key Python holds)."""
    if MODULE is None:
        return
    from ._routing import STATE

    override = STATE.precision_override
    token = _PRECISION_TOKENS.setdefault(override, len(_PRECISION_TOKENS))
    MODULE.set_state(STATE.current.id if STATE.current is not None else -1, token)


def suspend(delta: int) -> Any:
    """Count routing suspension on this thread in the extension; returns the module counted in (or None)."""
    module = MODULE
    if module is not None:
        module.suspend(delta)
    return module


def clear() -> None:
    if MODULE is not None:
        MODULE.clear_sites()


# ---------------------------------------------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------------------------------------------

class _Needs:
    """What a Python backward formula reads of autograd's ctx."""

    __slots__ = ("needs_input_grad",)

    def __init__(self, needs) -> None:
        self.needs_input_grad = (False,) + tuple(needs)


def _plan(launcher: Any) -> Any:
    return MODULE.Plan(launcher.prepared, list(launcher.outputs), launcher.workspace_bytes)


def _blas_value(kernel: str) -> Optional[int]:
    """PyTorch's BlasBackend value the extension switches to for ``kernel`` (-1: no switch; None: it cannot)."""
    from . import _compat

    backend = _compat.blas_library(kernel).backend
    if backend is None:
        return -1
    if isinstance(backend, str) or _torch_version() < 203:
        return None
    return int(getattr(backend, "value", backend))


def _linear_backward(site: Any, native_site: Any, grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     needs) -> tuple:
    """A backward the extension hands back to Python (a site's first, or create_graph): the Python formulas, then
    the routes they decided are handed to the extension for the next backwards."""
    from . import _fast, _kernels

    with _fast.no_torch_function():
        grads = _fast._linear_backward(site, _Needs(needs), grad, x, weight)
    if torch.is_grad_enabled() or MODULE is None:
        return grads
    log, state = site.scope.log, site.backward_state
    plans_run = not grad.is_cuda or HAS_CUDA  # the extension launches CUDA plans only when built with CUDA
    grad_x = state.get("grad_x")
    if grad_x is not None and grad_x.on_xpuruntime and plans_run:
        native_site.set_grad_x(_plan(grad_x.launcher), log.native_counter(grad_x, "xpuruntime::matmul"))
    grad_w_plan = state.get("grad_w_plan")
    grad_w = state.get("grad_w")
    if grad_w_plan is not None and plans_run:
        native_site.set_grad_w(log.native_counter(grad_w_plan, "xpuruntime::linear_grad_weight"),
                               plan=_plan(grad_w_plan.launcher))
    elif grad_w is not None:
        blas = _blas_value(_kernels._backward_gemm_kernel(site.route))
        if blas is not None:
            native_site.set_grad_w(log.native_counter(grad_w, "backward of linear"), blas=blas)
    return grads


def register(site: Any, func: Any, args: tuple, kwargs: dict) -> None:
    """Serve later calls of this signature (this call's func, args, kwargs) natively, where the site allows."""
    if DISPATCH is None:
        return
    site.native_tried = True
    from ._fast import Site

    if kwargs and isinstance(site, Site) and site.op != "attention":
        return  # the native linear and matmul sites read their tensors from the positional arguments only

    try:
        if not isinstance(site, Site):  # a TorchSite: PyTorch runs the call as it is
            native = _torch_site(site.scope, site.route, site.name)
        else:
            native = _routed_site(site, args)
            if native is None:
                return
        MODULE.register_site(func, args, kwargs, native)
    except ValueError:  # arguments the native key does not describe: the Python path serves them
        return


def _attention_backward(site: Any, native_site: Any, grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> tuple:
    """An attention backward the extension hands back to Python (a site's first, a create_graph one, or every one
    where the extension cannot call PyTorch's flash backward itself): the Python path's backward, then its arguments
    are handed to the extension for the next backwards."""
    from . import _fast, _kernels

    is_causal, scale, enable_gqa = site.attrs
    with _fast.no_torch_function():
        if torch.is_grad_enabled():  # create_graph: the differentiable formulas
            return _kernels.attention_backward(grad, q, k, v, None, is_causal, scale, enable_gqa, site.scope.id,
                                               site.route.id)
        route, kind, args = _fast.lse_backward_route(site, grad, q, k, v)
        site.scope.log.record(route, "backward of attention")
        grads = _kernels.lse_backward(kind, grad, q, k, v, out, lse, *args, is_causal, scale)
    # The extension calls PyTorch's flash backward itself from 2.3, its cuDNN backward (whose signature settled
    # later) from 2.9; otherwise this Python backward keeps running.
    if MODULE is not None and HAS_CUDA and _torch_version() >= (209 if kind == "torch_cudnn" else 203):
        native_site.set_flash_backward(*args, bool(is_causal), scale,
                                       site.scope.log.native_counter(route, "backward of attention"),
                                       kind == "torch_cudnn")
    return grads


def _routed_site(site: Any, args: tuple) -> Any:
    route = site.route
    if route.kernel == "torch" and not route.on_xpuruntime:  # PyTorch's own dispatch, no backend context
        return _torch_site(site.scope, route, site.name)
    if site.op == "attention":
        return _attention_site(site, args)
    if site.op not in ("linear", "matmul") or any(site.casts) or any(site.contig):
        return None
    if site.op == "matmul" and site.grad:
        return None
    if route.on_xpuruntime:
        if route.launcher.device.type == "cuda" and not HAS_CUDA:
            return None
        holder: list = []
        backward = None
        if site.grad:
            def backward(grad, x, weight, needs):
                return _linear_backward(site, holder[0], grad, x, weight, needs)
        counter = site.scope.log.native_counter(route, site.name)
        native = MODULE.Site(site.op, _plan(route.launcher), site.grad, counter, backward)
        holder.append(native)
        return native
    return None


def _attention_site(site: Any, args: tuple) -> Any:
    """A native attention site: xpuruntime's kernel on q, k, v (the first three positional arguments, contiguous as
    they come); with grad, only where the forward returns the log-sum-exp for PyTorch's flash backward."""
    route = site.route
    if len(args) < 3:  # q, k or v given by keyword: the extension reads them positionally
        return None
    if not route.on_xpuruntime or any(site.casts) or any(site.contig) or not HAS_CUDA:
        return None
    if route.launcher.device.type != "cuda" or (site.grad and site.lse_launcher is None):
        return None
    holder: list = []
    backward = None
    if site.grad:
        def backward(grad, q, k, v, out, lse):
            return _attention_backward(site, holder[0], grad, q, k, v, out, lse)
    launcher = site.lse_launcher if site.grad else route.launcher
    native = MODULE.Site("attention", _plan(launcher), site.grad, site.scope.log.native_counter(route, site.name),
                         backward)
    holder.append(native)
    return native


def _torch_site(scope: Any, route: Any, name: str) -> Any:
    """A native site that counts the call for ``route`` and calls PyTorch's function as it is."""
    return MODULE.Site("torch", None, False, scope.log.native_counter(route, name), None)
