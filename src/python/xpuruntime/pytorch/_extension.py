"""The native path's PyTorch extension (Note [The native path] in src/cpp/bindings/torch/routing_native.cpp):
building and loading it, switching it on and off, and the state Python shares with it.

The extension is compiled against the PyTorch in use with ``torch.utils.cpp_extension`` the first time routing is
turned on (a C++ compiler and PyTorch's headers are needed; about 20 to 60 seconds, once per PyTorch version and
source: the build is cached under ``$XPURUNTIME_CACHE_DIR`` or ``~/.cache/xpuruntime``). Where it cannot be built
(no compiler or headers, an installed package without the source) routing runs on the Python path, with the same
decisions and results, and :func:`status` says why. ``XPURUNTIME_TORCH_NATIVE=0`` (or :func:`set_enabled`) keeps
routing on the Python path.

A bottom module (Note [The layers of xpuruntime.pytorch] in __init__.py): it imports only ``_state`` of the
package. The routing mode the extension binds to is handed down by ``_mode`` (:func:`register_mode`); registering
call sites with the loaded extension is ``_native``'s part.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from .. import _core
from ._state import STATE

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

# The routing mode (_mode._MODE), the torch functions it handles and its Python handler: see register_mode.
_routing_mode: Any = None
_handled_functions: List[Any] = []
_python_handler: Any = None


def register_mode(mode: Any, functions: List[Any], python_handler: Any) -> None:
    """Name the routing mode object the extension binds to, the torch functions it handles and its Python
    ``__torch_function__`` (what the extension calls back for calls it does not serve). ``_mode`` calls this once,
    when it is imported, which the package's import does before anything can turn routing on."""
    global _routing_mode, _handled_functions, _python_handler
    _routing_mode, _handled_functions, _python_handler = mode, list(functions), python_handler


def torch_version() -> int:
    major, minor = torch.__version__.split(".")[:2]
    return int(major) * 100 + int("".join(c for c in minor if c.isdigit()) or 0)


def _build_dir() -> Path:
    root = os.environ.get("XPURUNTIME_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "xpuruntime")
    return Path(root) / "torch_native"


def _with_cuda() -> bool:
    if torch.version.cuda is None:
        return False
    from torch.utils import cpp_extension  # lazily: it is slow to import, and only a first build needs it

    return cpp_extension.CUDA_HOME is not None


def _load() -> Any:
    """The extension, built first where needed (cached by PyTorch version, build flags and source)."""
    source = SOURCE.read_bytes()
    cuda = _with_cuda()
    flags = ["-O2", f"-DXRT_TORCH_VERSION={torch_version()}"] + (["-DXRT_TORCH_CUDA"] if cuda else [])
    digest = hashlib.sha256(source + repr((torch.__version__, sys.version, flags)).encode()).hexdigest()[:16]
    name = f"xpuruntime_torch_native_{digest}"
    directory = _build_dir() / name
    built = directory / f"{name}.so"
    if built.exists():
        spec = importlib.util.spec_from_file_location(name, built)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    else:
        from torch.utils import cpp_extension  # lazily: slow to import, needed only to build

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
    if _routing_mode is None:
        raise _core.XpuRuntimeError("xpuruntime.pytorch: the native path was asked for before the routing mode was "
                                    "registered (xpuruntime.pytorch._mode registers it when imported)")
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
        module.configure(list(_handled_functions), _python_handler, _error, torch.nn.Parameter)
        MODULE, HAS_CUDA = module, cuda
        _status.update(loaded=True, reason="loaded", cuda=cuda)
        _switch()


def _switch() -> None:
    global DISPATCH
    if MODULE is not None and _status["enabled"]:
        DISPATCH = MODULE.bind(_routing_mode)
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
    if _routing_mode is None:  # nothing to attach to: DISPATCH is None too
        return
    if DISPATCH is not None and _compiling_depth == 0:
        _routing_mode.__dict__["__torch_function__"] = DISPATCH
    else:
        _routing_mode.__dict__.pop("__torch_function__", None)


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
    if torch_version() < 200:
        return None
    try:
        from torch._dynamo.callback import callback_handler  # lazily: Dynamo is slow to import, absent before 2.0
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
    """Forget the call sites registered with the extension."""
    if MODULE is not None:
        MODULE.clear_sites()
