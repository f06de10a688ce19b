"""The router: policy states, the decision for each routed call signature, and suspending routing.

Part of the bottom layer (Note [The layers of xpuruntime.pytorch] in __init__.py): it imports ``_compat``,
``_state``, ``_extension`` and ``_log`` of the package, nothing above them.

Note [How a routed call is decided]
A call (op, phase, input shapes/dtypes/device, attributes) is decided once per policy scope and cached as a
:class:`Route`:

1. The KernelPolicy's rule for the op (its own key, else its family's: ``matmul`` covers ``linear``). No rule: the
   call stays on PyTorch's own dispatch (rule ``unrouted``); routing is opt-in per op.
2. The candidates: every xpuruntime kernel of the op, asked by the C++ registry whether it supports the call
   (``xrt._core.ops_candidates``: dtype, rank, head dim, alignment, device, determinism), then PyTorch's own backends
   (``torch``, ``torch_flash``, ``torch_cublaslt``, ...), asked PyTorch's own questions (e.g.
   ``torch.backends.cuda.can_use_flash_attention`` with its debug reasons).
3. The rule picks: ``pinned`` -> that kernel or UnsupportedOperationError with its reason and the kernels that could;
   ``preferred`` -> the first listed kernel that supports the call, else PyTorch's own dispatch (``fallback``, with
   every skipped kernel's reason); ``auto`` -> the first supporting xpuruntime kernel in registry priority order
   (``BestPerformance``: the C++ dispatcher times them, through the same autotune cache as inference), else
   PyTorch's own dispatch.
4. An xpuruntime winner gets a plan from the C++ dispatcher (``xrt._core.ops_plan`` with a policy pinned to it): its
   output shapes, its workspace size and the plan's description (e.g. the cuBLASLt algorithm). Each call then
   allocates outputs and workspace with torch and runs on torch's current stream (see _kernels.run_xpuruntime).

For one kernel name, the choice is the one InferenceSession's dispatcher makes: a preferred ``cublasLt`` that can
run the call runs it in both. They differ only where the rule cannot be honoured: training falls back to PyTorch's
own dispatch, inference to the next xpuruntime kernel in priority order (docs/pytorch.md).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .. import _core
from ..policies import ExecutionPolicy, KernelPolicy
from . import _compat, _extension
from ._log import DecisionLog
from ._state import STATE

#: The ops xpuruntime.pytorch routes, and PyTorch's kernels for each (the registry's external kernels).
ROUTED_OPS = ("matmul", "linear", "conv2d", "attention")
TORCH_KERNELS: Dict[str, Tuple[str, ...]] = {
    "matmul": ("torch", "torch_cublas", "torch_cublaslt"),
    "linear": ("torch", "torch_cublas", "torch_cublaslt"),
    "linear_grad_weight": ("torch", "torch_cublas", "torch_cublaslt"),
    "conv2d": ("torch", "torch_cudnn"),
    "attention": ("torch", "torch_flash", "torch_efficient", "torch_math", "torch_cudnn"),
}
#: The PyTorch kernel that runs the same library as an xpuruntime kernel (used where xpuruntime has no backward).
TORCH_EQUIVALENT = {"cublasLt": "torch_cublaslt", "cublas": "torch_cublas", "cpu": "torch", "flash_v2": "torch_flash",
                    "unfused": "torch_math", "cudnn": "torch_cudnn", "cudnn_search": "torch_cudnn"}

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
                torch.float64: "float64"}
TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                "float64": torch.float64, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
                "int32": torch.int32, "int64": torch.int64, "bool": torch.bool}


def _families() -> Dict[str, str]:
    return {s["name"]: s["family"] for s in _core.op_schemas() if s["name"] in ROUTED_OPS}


FAMILIES: Dict[str, str] = _families()


def precision_name(dtype: torch.dtype, tf32: bool) -> str:
    """The ExecutionPolicy precision name a call of ``dtype`` runs in."""
    if dtype == torch.float16:
        return "fp16"
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float32:
        return "tf32" if tf32 else "fp32"
    if dtype == torch.float64:
        return "fp64"
    return str(dtype).replace("torch.", "")


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype) or str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------------------------------------------
# Suspending the routing mode (backward formulas and kernels call torch functions that must not be re-routed)
# ---------------------------------------------------------------------------------------------------------------

_local = threading.local()


def routing_suspended() -> bool:
    """Whether routing is suspended on this thread (the mode then passes every call to PyTorch)."""
    return getattr(_local, "suspended", 0) > 0


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Suspend routing on this thread while the block runs (nested blocks count)."""
    _local.suspended = getattr(_local, "suspended", 0) + 1
    native = _extension.suspend(1)  # the native path's own count (Note [The native path])
    try:
        yield
    finally:
        _local.suspended -= 1
        if native is not None:
            native.suspend(-1)


def torch_backend_context(kernel: str, op: str) -> contextlib.AbstractContextManager:
    """The context that makes PyTorch run ``op`` on its backend ``kernel`` (a name of :data:`TORCH_KERNELS`): a BLAS
    library, cuDNN, an SDPA backend; no context for ``torch``. (TF32 follows PyTorch's own flags, which
    xpuruntime.pytorch.autocast sets.)"""
    if op in ("matmul", "linear") and kernel in ("torch_cublas", "torch_cublaslt"):
        return _compat.blas_library(kernel)
    if op == "conv2d" and kernel == "torch_cudnn":
        return _compat.cudnn_enabled(True)
    if op == "attention" and kernel != "torch":
        return _compat.sdpa_backend(kernel)
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------------------------
# Policy states (a PolicyScope, in _mode, puts one in force)
# ---------------------------------------------------------------------------------------------------------------

_state_ids = itertools.count(1)
_STATES: Dict[int, "PolicyState"] = {}
_STATES_BY_POLICY: Dict[Tuple[str, str], "PolicyState"] = {}
_state_lock = threading.Lock()


@dataclass
class _Rule:
    key: str            # the policy key that applies: the op or its family
    mode: str           # pinned / preferred / auto
    kernels: List[str]
    strategy: str
    short: str          # the rule in short form ("cublasLt", "pin:flash_v2", "auto")


class PolicyState:
    """One (KernelPolicy, ExecutionPolicy) pair as the router sees it: its rules per op, its decisions (routes) and
    the decision log being written. One per distinct pair (see :func:`policy_state`): setting the same policy again
    reuses its decisions and plans. Its ``id`` is what the custom ops carry."""

    def __init__(self, policy: KernelPolicy, exec_policy: ExecutionPolicy) -> None:
        self.id = next(_state_ids)
        self.policy = policy
        self.exec_policy = exec_policy
        self.log = DecisionLog(repr(policy), repr(exec_policy))
        self._rules: Dict[str, Optional[_Rule]] = {}
        self._exec_policies: Dict[Optional[str], ExecutionPolicy] = {}
        #: The ops routed anywhere but PyTorch's default dispatch (fixed at creation: torch.compile guards on it).
        self.routed_ops = frozenset(op for op in ROUTED_OPS if self.routes(op))

    def rule_for(self, op: str) -> Optional[_Rule]:
        """The rule that governs ``op`` (its own, else its family's), or None when the policy names neither."""
        if op not in self._rules:
            family = FAMILIES.get(op, op)
            key = op if self.policy.get(op) is not None else (family if self.policy.get(family) is not None else None)
            if key is None:
                self._rules[op] = None
            else:
                rule = self.policy.resolve(op, family)
                self._rules[op] = _Rule(key, rule["mode"], list(rule.get("kernels", [])),
                                        rule.get("strategy", ""), self.policy.get(key) or "")
        return self._rules[op]

    def routes(self, op: str) -> bool:
        """Whether the policy routes ``op`` anywhere but PyTorch's own default dispatch."""
        rule = self.rule_for(op)
        return rule is not None and not (rule.mode != "auto" and rule.kernels == ["torch"])

    def effective_exec_policy(self) -> ExecutionPolicy:
        """The ExecutionPolicy with xpuruntime.pytorch.autocast's precision (tf32/fp32) applied."""
        override = STATE.precision_override
        policy = self._exec_policies.get(override)
        if policy is None:
            policy = self.exec_policy.copy()
            if override is not None:
                policy.precision = override
            self._exec_policies[override] = policy
        return policy

    def __repr__(self) -> str:
        return f"<PolicyState {self.id}: {self.policy!r} {self.exec_policy!r}>"


def policy_state(policy: KernelPolicy, exec_policy: ExecutionPolicy) -> PolicyState:
    """The PolicyState of this pair of policies (made on first use)."""
    key = (policy.to_json(), exec_policy.to_json())
    with _state_lock:
        state = _STATES_BY_POLICY.get(key)
        if state is None:
            state = PolicyState(policy.copy(), exec_policy.copy())
            _STATES_BY_POLICY[key] = state
            _STATES[state.id] = state
        return state


def scope_by_id(scope_id: int) -> PolicyState:
    scope = _STATES.get(scope_id)
    if scope is None:
        raise _core.InvalidArgumentError(f"xpuruntime.pytorch: no kernel policy with id {scope_id}")
    return scope


# ---------------------------------------------------------------------------------------------------------------
# Routes
# ---------------------------------------------------------------------------------------------------------------

@dataclass(eq=False)
class Route:
    """The decision for one call signature under one scope (Note [How a routed call is decided])."""

    id: int
    scope_id: int
    op: str
    phase: str
    signature: str
    device: torch.device
    kernel: str
    backend: str
    rule: str
    policy_rule: str
    reason: str
    precision: str
    candidates: List[dict] = field(default_factory=list)
    plan: str = ""
    backward: str = ""
    policy_kernels: List[str] = field(default_factory=list)  # the rule's kernels, in order
    # What running on xpuruntime needs.
    kernel_policy: Optional[KernelPolicy] = None
    exec_policy: Optional[ExecutionPolicy] = None
    attrs: Optional[dict] = None
    launcher: Optional["Launcher"] = None  # the C++ plan, prepared once, with its outputs and workspace size

    @property
    def on_xpuruntime(self) -> bool:
        return self.backend != "pytorch"


_ROUTES: List[Route] = []
_CACHE: Dict[tuple, Route] = {}
_route_lock = threading.Lock()


def clear_decisions() -> None:
    """Forget every cached decision (the routes stay valid for the ids that hold them). ``_fast.clear_routes``
    forgets the call sites that hold them as well."""
    with _route_lock:
        _CACHE.clear()


def route_by_id(route_id: int) -> Route:
    return _ROUTES[route_id]


def signature_text(tensors: Sequence[Optional[torch.Tensor]], attrs: Optional[dict]) -> str:
    parts = [f"{dtype_name(t.dtype)}[{', '.join(str(int(d)) for d in t.shape)}]" if t is not None else "-"
             for t in tensors]
    text = ", ".join(parts)
    if attrs:
        text += "; " + ", ".join(f"{k}={v}" for k, v in attrs.items())
    return text


def _new_route(**kwargs: Any) -> Route:
    route = Route(id=len(_ROUTES), **kwargs)
    _ROUTES.append(route)
    return route


TorchSupport = Callable[[str], Tuple[bool, str]]


def decide(scope: PolicyState, op: str, phase: str, tensors: Sequence[Optional[torch.Tensor]], attrs: dict,
           attrs_key: tuple, torch_support: TorchSupport, *, rule_op: Optional[str] = None,
           backward: Callable[[Route], str] = lambda route: "",
           torch_call: Optional[Callable[..., torch.Tensor]] = None) -> Route:
    """The (cached) route of a call; ``tensors`` are the op's inputs in xpuruntime's schema order (None for an
    absent optional one), already contiguous and cast the way they will run. ``torch_call(*tensors)`` runs the call
    on PyTorch, for ops whose PyTorch backends auto:BestPerformance times against xpuruntime's kernel (Note
    [Autotuning across engines])."""
    key = (scope.id, op, phase, rule_op, STATE.precision_override,
           tuple((t.shape, t.dtype, t.device) if t is not None else None for t in tensors), attrs_key)
    route = _CACHE.get(key)
    if route is not None:
        return route
    with _route_lock:
        route = _CACHE.get(key)
        if route is None:
            route = _decide(scope, op, phase, tensors, attrs, torch_support, rule_op or op, torch_call)
            route.backward = backward(route)
            _CACHE[key] = route
    return route


def torch_route(scope: PolicyState, op: str, phase: str, tensors: Sequence[Optional[torch.Tensor]], kernel: str,
                reason: str, rule: str = "backward", attrs: Optional[dict] = None, tf32: bool = False) -> Route:
    """The (cached) record of a call that PyTorch's ``kernel`` runs by construction (a backward GEMM, a gradient
    xpuruntime has no kernel for): nothing to decide, but the decision log shows it."""
    key = (scope.id, op, phase, "torch:" + kernel, STATE.precision_override,
           tuple((t.shape, t.dtype, t.device) if t is not None else None for t in tensors))
    route = _CACHE.get(key)
    if route is not None:
        return route
    with _route_lock:
        route = _CACHE.get(key)
        if route is None:
            first = next(t for t in tensors if t is not None)
            route = _new_route(scope_id=scope.id, op=op, phase=phase, signature=signature_text(tensors, attrs),
                               device=first.device, kernel=kernel, backend="pytorch", rule=rule, policy_rule="",
                               reason=reason, precision=precision_name(first.dtype, tf32))
            _CACHE[key] = route
    return route


def xpuruntime_views(tensors: Sequence[Optional[torch.Tensor]]) -> list:
    """Zero-copy xpuruntime tensors of ``tensors`` as kernels take them (``_compat.kernel_input``; None stays)."""
    return [_core.from_dlpack(_compat.dlpack(_compat.kernel_input(t))) if t is not None else None for t in tensors]


def _xpuruntime_candidates(op: str, capsules: list, attrs: dict, exec_policy: ExecutionPolicy) -> List[dict]:
    return [dict(c, supported=bool(c["supported"])) for c in
            _core.ops_candidates(op, capsules, attrs, None, exec_policy)]


# Note [Autotuning across engines]
# Under auto:BestPerformance, xpuruntime's dispatcher times its own kernels (and their tactics) on scratch tensors.
# Where PyTorch's backends are other implementations than xpuruntime's kernels -- attention: cuDNN's, the
# memory-efficient one, FlashAttention-2 -- the router then times xpuruntime's winner and each PyTorch backend the
# call supports in the same way, on the call's own tensors (read-only; routing suspended, no grad): a few warm-up
# calls, then the median of several runs between CUDA events. (PyTorch's GEMM backends are the same cuBLAS
# libraries as xpuruntime's GEMM kernels, which also keep their gradients' routes, so GEMMs are not timed against
# them.) A PyTorch backend runs the call only when it is faster by more than _ENGINE_MARGIN (closer timings are
# run-to-run noise); among PyTorch's backends its own default dispatch (`torch`, which the native path calls with no
# backend switch) is taken when it is within the margin of the fastest. PyTorch's backend, when it wins, also runs
# the gradients (its own autograd). The log records every time: the winner's is the figure timed here, through the
# same Python call as PyTorch's; the other xpuruntime candidates keep the C++ autotuner's kernel-only times, which
# are not comparable with these. The choice is made once per call signature.
_TIMING_WARMUP, _TIMING_RUNS = 3, 10
_ENGINE_MARGIN = 0.05


def _time_call(fn: Callable[[], Any]) -> float:
    """Median microseconds of ``fn()`` between CUDA events on the current stream."""
    for _ in range(_TIMING_WARMUP):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(_TIMING_RUNS):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)
    return sorted(times)[len(times) // 2]


def _time_engines(op: str, tensors: Sequence[Optional[torch.Tensor]], launcher: "Launcher",
                  torch_call: Callable[..., torch.Tensor], candidates: List[dict]) -> Tuple[float, Dict[str, float]]:
    """Microseconds per call of xpuruntime's ``launcher`` and of each supported PyTorch candidate, which also gets
    its time (or, when PyTorch refuses the call, its reason) in ``candidates``."""
    times: Dict[str, float] = {}
    with suspended(), torch.no_grad():
        own = _time_call(lambda: launcher(list(tensors)))
        for c in candidates:
            if c["backend"] != "pytorch" or not c["supported"]:
                continue
            try:
                with torch_backend_context(c["kernel"], op):  # entered once: its own cost is not the call's
                    c["time_us"] = times[c["kernel"]] = _time_call(lambda: torch_call(*tensors))
            except RuntimeError as error:  # e.g. an SDPA backend that cannot run these inputs after all
                c["supported"] = False
                c["reason"] = f"PyTorch refused it when timed: {str(error).splitlines()[0][:160]}"
    return own, times


def _decide(scope: PolicyState, op: str, phase: str, tensors: Sequence[Optional[torch.Tensor]], attrs: dict,
            torch_support: TorchSupport, rule_op: str,
            torch_call: Optional[Callable[..., torch.Tensor]] = None) -> Route:
    first = next(t for t in tensors if t is not None)
    exec_policy = scope.effective_exec_policy()
    signature = signature_text(tensors, attrs)
    rule = scope.rule_for(rule_op)
    xrt_tf32 = exec_policy.precision == "tf32"
    torch_tf32 = _compat.tf32_allowed(first.device.type)

    def torch_winner(kernel: str, rule_name: str, reason: str, candidates: List[dict], policy_rule: str) -> Route:
        return _new_route(scope_id=scope.id, op=op, phase=phase, signature=signature, device=first.device,
                          kernel=kernel, backend="pytorch", rule=rule_name, policy_rule=policy_rule, reason=reason,
                          precision=precision_name(first.dtype, torch_tf32), candidates=candidates,
                          policy_kernels=list(rule.kernels) if rule else [])

    if rule is None:
        family = FAMILIES.get(rule_op, rule_op)
        where = f"'{rule_op}'" + (f" or its family '{family}'" if family != rule_op else "")
        return torch_winner("torch", "unrouted", f"the KernelPolicy has no rule for {where}: PyTorch's own dispatch",
                            [], "")

    if first.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise _core.UnsupportedOperationError(
            f"xpuruntime.pytorch: the first {op} call with {signature} ({phase}) came during CUDA graph capture, "
            "where its kernel cannot be chosen (that queries and may time kernels). Run the captured code once "
            "before capturing it; capture_graph(fn, ...) does this warm-up for you")
    # xpuruntime views (zero-copy) of the inputs, reusable across the queries below (a capsule is consumed once).
    capsules = xpuruntime_views(tensors)
    try:
        xrt = _xpuruntime_candidates(op, capsules, attrs, exec_policy)
    except (_core.InvalidArgumentError, _core.InvalidTypeError) as error:
        # xpuruntime's shape inference rejects the call (PyTorch may accept it, e.g. broadcasting it lacks).
        xrt = [{"kernel": k.name, "backend": k.backend, "supported": False, "reason": f"rejects the call: {error}",
                "time_us": None} for k in _core.kernels(op)]
    torch_candidates = []
    for name in TORCH_KERNELS[op]:
        ok, why = torch_support(name)
        torch_candidates.append({"kernel": name, "backend": "pytorch", "supported": ok, "reason": why,
                                 "time_us": None})
    candidates = xrt + torch_candidates
    by_name = {c["kernel"]: c for c in candidates}
    for name in rule.kernels:  # a family rule may name a kernel of a sibling op only
        by_name.setdefault(name, {"kernel": name, "backend": "", "supported": False,
                                  "reason": f"does not implement {op}", "time_us": None})
    supported = [c["kernel"] for c in candidates if c["supported"]]

    winner: Optional[str] = None
    decision = None
    if rule.mode == "pinned":
        name = rule.kernels[0]
        if not by_name[name]["supported"]:
            raise _core.UnsupportedOperationError(
                f"pinned kernel '{name}' cannot run {op} ({phase}) on {signature} ({first.device}): "
                f"{by_name[name]['reason']}. Kernels that could: {', '.join(supported) or 'none'} (unpin it, or use "
                f"\"{name}\" as a preferred kernel to allow a fallback)")
        winner, rule_name, reason = name, "pinned", "pinned by the KernelPolicy"
    elif rule.mode == "preferred":
        skipped = []
        for name in rule.kernels:
            if by_name[name]["supported"]:
                winner = name
                break
            skipped.append(f"{name}: {by_name[name]['reason']}")
        if winner is None:
            return torch_winner("torch", "fallback", f"no preferred kernel could run it ({'; '.join(skipped)}); "
                                "PyTorch's own dispatch runs it", candidates, rule.short)
        rule_name = "preferred"
        reason = "preferred by the KernelPolicy" + (
            f" (earlier preferences skipped: {'; '.join(skipped)})" if skipped else "")
    elif rule.strategy == "BestPerformance":
        auto = KernelPolicy({op: "auto:BestPerformance"})
        try:
            decision, _, _ = _core.ops_plan(op, capsules, attrs, auto, exec_policy)
        except _core.UnsupportedOperationError as error:
            return torch_winner("torch", "fallback", f"no xpuruntime kernel can run it ({error}); PyTorch's own "
                                "dispatch runs it", candidates, rule.short)
        winner, rule_name, reason = decision.kernel, decision.rule, decision.reason
        timed = {c["kernel"]: c for c in decision.candidates}
        candidates = [dict(c, **({"time_us": timed[c["kernel"]]["time_us"], "reason": timed[c["kernel"]]["reason"]}
                                 if c["kernel"] in timed else {})) for c in candidates]
    else:
        winner = next((c["kernel"] for c in xrt if c["supported"]), None)
        if winner is None:
            return torch_winner("torch", "fallback", "no xpuruntime kernel can run it: " + "; ".join(
                f"{c['kernel']}: {c['reason']}" for c in xrt) + "; PyTorch's own dispatch runs it", candidates,
                rule.short)
        rule_name, reason = "first-supported", "first supported kernel in priority order"

    for c in candidates:
        if c["supported"] and c["kernel"] != winner and not c["reason"]:
            c["reason"] = f"not chosen ({rule_name})"
    if by_name.get(winner, {}).get("backend") == "pytorch":
        return torch_winner(winner, rule_name, reason, candidates, rule.short)

    # An xpuruntime kernel: the C++ dispatcher plans it (pinned, so that the plan is exactly this kernel's), once.
    # An autotuned one takes the plan autotuning kept (the same dispatcher under the same auto policy returns it):
    # its fastest tactic, e.g. the quickest of cuBLASLt's algorithms (Note [Tactics] in dispatcher.cpp).
    pinned_policy = KernelPolicy({op: f"pin:{winner}"})
    plan_policy = KernelPolicy({op: "auto:BestPerformance"}) if decision is not None else pinned_policy
    launcher = Launcher(_core.PreparedCall(op, capsules, attrs, plan_policy, exec_policy), first.device)
    plan_decision = launcher.prepared.decision
    if decision is not None and torch_call is not None and first.device.type == "cuda":
        own, times = _time_engines(op, tensors, launcher, torch_call, candidates)  # Note [Autotuning across engines]
        next(c for c in candidates if c["kernel"] == winner)["time_us"] = own
        best = min(times.values()) if times else None
        for c in candidates:
            if c["kernel"] in times:
                c["reason"] = f"{'faster' if times[c['kernel']] < own else 'slower'} ({times[c['kernel']]:.1f} us)"
        if best is not None and best < own * (1.0 - _ENGINE_MARGIN):
            fastest = min(times, key=times.get)
            chosen = "torch" if times.get("torch", float("inf")) <= best * (1.0 + _ENGINE_MARGIN) else fastest
            return torch_winner(chosen, "autotuned", f"autotuned across engines: PyTorch's {chosen} "
                                f"({times[chosen]:.1f} us) against xpuruntime's {winner} ({own:.1f} us)",
                                candidates, rule.short)
        if best is not None:
            reason += f"; PyTorch's backends timed too: xpuruntime {own:.1f} us, PyTorch's best {best:.1f} us"
    return _new_route(scope_id=scope.id, op=op, phase=phase, signature=signature, device=first.device,
                      kernel=winner, backend=plan_decision.backend, rule=rule_name, policy_rule=rule.short,
                      reason=reason, precision=precision_name(first.dtype, xrt_tf32), candidates=candidates,
                      plan=plan_decision.plan_summary, policy_kernels=list(rule.kernels),
                      kernel_policy=pinned_policy, exec_policy=exec_policy, attrs=attrs, launcher=launcher)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def raw_stream(device: torch.device) -> int:
    """The handle (an int) of torch's current CUDA stream on ``device``; 0 on the CPU."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


class Launcher:
    """An xpuruntime kernel's C++ plan (``xrt._core.PreparedCall``) and what calling it needs on torch's side.

    Note [The routed call's host path]
    A routed call is planned once per signature (the route); each call then allocates the outputs and the
    workspace with ``torch.empty`` (PyTorch's caching allocator: inside ``torch.cuda.graph`` they come from the
    graph's private pool) and launches the plan on the tensors' data pointers and torch's current stream, with no
    DLPack exchange and no lookup on the C++ side. So the kernel is stream-ordered with the surrounding PyTorch work
    and no memory outside PyTorch's allocator is touched: a captured graph replays it safely. Inputs must be
    contiguous (the callers make them so); one less aligned than the prepared plan allows (a view at an odd offset)
    is copied first.
    """

    __slots__ = ("prepared", "outputs", "workspace_bytes", "device")

    def __init__(self, prepared: Any, device: torch.device) -> None:
        self.prepared = prepared
        self.outputs = [(tuple(shape), TORCH_DTYPES[dtype]) for shape, dtype in prepared.outputs]
        self.workspace_bytes = int(prepared.workspace_bytes)
        self.device = device

    def __call__(self, inputs: Sequence[Optional[torch.Tensor]]) -> List[torch.Tensor]:
        first = inputs[0]
        outputs = [first.new_empty(shape, dtype=dtype) for shape, dtype in self.outputs]
        stream = raw_stream(self.device)
        pointers = [t.data_ptr() if t is not None else 0 for t in inputs]
        if any(p & 15 for p in pointers):  # plans are prepared on 16-byte aligned inputs (kernel_input)
            inputs = [_compat.kernel_input(t) if t is not None else None for t in inputs]
            pointers = [t.data_ptr() if t is not None else 0 for t in inputs]
        workspace = _workspace(self.device, self.workspace_bytes, stream) if self.workspace_bytes else None
        self.prepared.launch(pointers, [o.data_ptr() for o in outputs],
                             workspace.data_ptr() if workspace is not None else 0, self.workspace_bytes, stream)
        return outputs


# Note [Workspaces per stream]
# A kernel's workspace is scratch memory that only its own launch touches. Launches on one stream run in order, so
# one workspace per (device, stream) serves every routed call on that stream (PyTorch keeps its cuBLAS workspaces
# the same way). It comes from torch's allocator on that stream and grows when a call needs more; a replaced one
# is kept (never freed), because a CUDA graph captured over it replays on its address. While the stream captures, a
# call that needs more gets a workspace of its own from the graph's pool, as any tensor allocated there.
_WORKSPACES: Dict[Tuple[torch.device, int], torch.Tensor] = {}
_RETIRED_WORKSPACES: List[torch.Tensor] = []


def _workspace(device: torch.device, nbytes: int, stream: int) -> torch.Tensor:
    key = (device, stream)
    buffer = _WORKSPACES.get(key)
    if buffer is not None and buffer.numel() >= nbytes:
        return buffer
    fresh = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return fresh
    if buffer is not None:
        _RETIRED_WORKSPACES.append(buffer)
    _WORKSPACES[key] = fresh
    return fresh
