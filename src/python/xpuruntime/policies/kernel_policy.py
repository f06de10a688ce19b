"""KernelPolicy: which kernel runs each op, written down."""

from __future__ import annotations

from typing import Dict, Iterable, Mapping, Optional, Sequence, Union

from .. import _core
from ._serializable import SerializablePolicy

RuleSpec = Union[str, Sequence[str], Mapping[str, object]]


def pinned(kernel: str) -> str:
    """The short form of a pinned rule: the op must run on ``kernel`` or fail with the reason."""
    return f"pin:{kernel}"


def preferred(*kernels: str) -> list:
    """A preferred rule: the first of ``kernels`` that can run the op, else a recorded fallback."""
    return list(kernels)


class KernelPolicy(SerializablePolicy, _core.KernelPolicy):
    """Which kernel runs each op.

    Keys are ops (``"linear"``) or op families (``"matmul"`` covers ``matmul`` and ``linear``); the op's own
    rule wins over its family's. A rule is one of

    - ``"cublasLt"``: preferred (use it when it can run the op, else fall back and record why);
    - ``["cublasLt", "cublas"]``: preferred, in order;
    - ``"pin:cublasLt"`` (or :func:`pinned`, or ``"cublasLt!"``): must use it, else
      :class:`~xpuruntime.UnsupportedOperationError` with the reason;
    - ``"auto"`` / ``"auto:BestPerformance"``: choose automatically: ``FirstSupported`` takes the registry's
      priority order, ``BestPerformance`` times every supporting kernel on the real shapes and keeps the fastest
      (cached in the autotune cache, replayed without re-timing);
    - a dict ``{"mode": "pinned" | "preferred" | "auto", "kernels": [...], "strategy": ...}``.

    Ops without a rule use ``auto`` with ``auto_strategy``.

    Parameters
    ----------
    rules : mapping, optional
        ``{key: rule}``, e.g. ``{"attention": "pin:flash_v2"}``.
    auto_strategy : {"FirstSupported", "BestPerformance"}
        The strategy of ``auto`` rules and of ops without a rule. Default ``"FirstSupported"``.
    **kwargs
        More rules, e.g. ``matmul="cublasLt"``.

    Examples
    --------
    >>> policy = xrt.KernelPolicy(matmul="cublasLt", attention=xrt.pinned("flash_v2"))
    >>> policy.save("policy.json"); xrt.KernelPolicy.load("policy.json") == policy
    True
    """

    _core_class = _core.KernelPolicy

    def __init__(self, rules: Optional[Mapping[str, RuleSpec]] = None, /, *,
                 auto_strategy: str = "FirstSupported", **kwargs: RuleSpec) -> None:
        super().__init__()
        self.auto_strategy = auto_strategy
        for key, rule in {**(dict(rules) if rules else {}), **kwargs}.items():
            self.set(key, rule)

    # ---- rules ----
    def set(self, key: str, rule: RuleSpec, *, mode: Optional[str] = None) -> "KernelPolicy":  # type: ignore[override]
        """Set the rule of ``key`` (chainable). ``mode`` forces ``"pinned"``/``"preferred"`` for a kernel name."""
        if mode is not None:
            kernels = [rule] if isinstance(rule, str) else list(rule)  # type: ignore[arg-type]
            _core.KernelPolicy.set_rule(self, key, mode, kernels if mode != "auto" else [], "")
        elif isinstance(rule, str):
            _core.KernelPolicy.set(self, key, rule)
        elif isinstance(rule, Mapping):
            unknown = set(rule) - {"mode", "kernels", "strategy"}
            if unknown:
                raise _core.InvalidArgumentError(
                    f"unknown key(s) {sorted(unknown)} in the rule for '{key}'; valid keys: kernels, mode, strategy")
            kernels = rule.get("kernels", [])
            kernels = [kernels] if isinstance(kernels, str) else list(kernels)  # type: ignore[arg-type]
            _core.KernelPolicy.set_rule(self, key, str(rule.get("mode", "preferred")), kernels,
                                        str(rule.get("strategy", "")))
        elif isinstance(rule, Iterable):
            kernels = list(rule)
            if not kernels or not all(isinstance(k, str) for k in kernels):
                raise _core.InvalidArgumentError(f"the rule for '{key}' must list kernel names, got {rule!r}")
            _core.KernelPolicy.set_rule(self, key, "preferred", kernels, "")
        else:
            raise _core.InvalidTypeError(
                f"the rule for '{key}' must be a kernel name, a list of kernel names or a dict, got {type(rule).__name__}")
        return self

    def pin(self, key: str, kernel: str) -> "KernelPolicy":
        """Pin ``key`` to ``kernel`` (chainable)."""
        return self.set(key, kernel, mode="pinned")

    def prefer(self, key: str, *kernels: str) -> "KernelPolicy":
        """Prefer ``kernels`` for ``key``, in order (chainable)."""
        return self.set(key, list(kernels), mode="preferred")

    def auto(self, key: str, strategy: Optional[str] = None) -> "KernelPolicy":
        """Let ``key`` choose automatically (chainable)."""
        return self.set(key, "auto" if strategy is None else f"auto:{strategy}")

    def remove(self, key: str) -> "KernelPolicy":  # type: ignore[override]
        """Remove the rule of ``key`` if there is one (chainable)."""
        _core.KernelPolicy.remove(self, key)
        return self

    def get(self, key: str) -> Optional[str]:  # type: ignore[override]
        """The rule of ``key`` in short form (``"cublasLt"``, ``"pin:flash_v2"``, ``"auto"``), or None."""
        return _core.KernelPolicy.get(self, key)

    @property
    def preferences(self) -> Dict[str, str]:
        """Every rule in short form, by key."""
        return dict(self.short_forms())

    @property
    def rules(self) -> Dict[str, dict]:
        """Every rule as ``{"mode": ..., "kernels": [...]}`` or ``{"mode": "auto", "strategy": ...}``."""
        return dict(self.rule_dicts())

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return len(self.short_forms())
