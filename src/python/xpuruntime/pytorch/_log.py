"""The decision log of xpuruntime.pytorch: which kernel each routed call ran and why.

One record per call site, deduplicated by phase, op, shapes and dtypes, with how many times it ran. Records have
the fields of the inference explain report's nodes (``node``, ``op_type``, ``op``, ``kernel``, ``backend``,
``precision``, ``rule``, ``policy_rule``, ``reason``, ``candidates``, ``rejected``) plus ``phase``, ``signature``,
``calls``, ``plan`` and ``backward``; :meth:`DecisionLog.to_report` wraps them in the report format of
:mod:`xpuruntime.report`, so that ``render_text``/``render_html``/``render_json`` show them like a session's.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

from .. import __version__
from .. import report as _report
from . import _extension


class DecisionLog:
    """The decisions made under one kernel policy scope (see :func:`~xpuruntime.pytorch.set_kernel_policy`).

    Thread-safe: backward passes record from autograd's threads.

    Examples
    --------
    >>> log = xrt_torch.decision_log()
    >>> for r in log.records: print(r["node"], r["kernel"], r["calls"], r["reason"])
    >>> print(log)                       # the text explain report
    >>> log.kernels()                    # {"linear": ["cublasLt"], "attention": ["flash_v2"]}
    """

    def __init__(self, policy_text: str = "", exec_policy_text: str = "") -> None:
        self._lock = threading.Lock()
        self._records: Dict[Any, dict] = {}
        self._per_op: Dict[tuple, int] = {}
        self._counters: List[tuple] = []  # (native counter, route, op_type): calls the native path counted
        self._policy_text = policy_text
        self._exec_policy_text = exec_policy_text

    def record(self, route: Any, op_type: str) -> None:
        """Count one call that ran under ``route`` (a Route of the router)."""
        with self._lock:
            self._count(route, op_type, 1)

    def _count(self, route: Any, op_type: str, calls: int) -> None:
        entry = self._records.get(route.id)
        if entry is None:
            entry = self._new_record(route, op_type)
            self._records[route.id] = entry
        entry["calls"] += calls

    def native_counter(self, route: Any, op_type: str) -> Any:
        """A counter of xpuruntime.pytorch's native path whose calls count for ``route`` when the log is read."""
        counter = _extension.MODULE.Counter()
        with self._lock:
            self._counters.append((counter, route, op_type))
        return counter

    def hand_over(self, successor: "DecisionLog") -> None:
        """``successor`` becomes the log the native path's counters count for (the policy was set again: its state's
        new log); the calls counted so far stay in this one."""
        with self._lock:
            self._flush()
            counters, self._counters = self._counters, []
        with successor._lock:
            successor._counters.extend(counters)

    def _flush(self) -> None:
        """Add the calls the native path counted since the last read (the lock held)."""
        for counter, route, op_type in self._counters:
            calls = counter.take()
            if calls:
                self._count(route, op_type, calls)

    def _new_record(self, route: Any, op_type: str) -> dict:
        counter = (route.op, route.phase)
        index = self._per_op.get(counter, 0)
        self._per_op[counter] = index + 1
        node = f"{route.op}#{index}" + ("" if route.phase == "forward" else f" ({route.phase})")
        candidates = [dict(c) for c in route.candidates]
        return {
            "node": node,
            "op_type": op_type,
            "op": route.op,
            "phase": route.phase,
            "signature": route.signature,
            "device": str(route.device),
            "kernel": route.kernel,
            "backend": route.backend,
            "precision": route.precision,
            "rule": route.rule,
            "policy_rule": route.policy_rule,
            "reason": route.reason,
            "plan": route.plan,
            "backward": route.backward,
            "candidates": candidates,
            "rejected": [c for c in candidates if c["kernel"] != route.kernel],
            "calls": 0,
        }

    @property
    def records(self) -> List[dict]:
        """Every record (copies), in the order the call sites first ran."""
        with self._lock:
            self._flush()
            return [dict(r) for r in self._records.values()]

    def kernels(self, phase: Optional[str] = "forward") -> Dict[str, List[str]]:
        """``{op: [kernels, in first-use order]}`` over the records of ``phase`` (None: every phase)."""
        out: Dict[str, List[str]] = {}
        for r in self.records:
            if phase is None or r["phase"] == phase:
                kernels = out.setdefault(r["op"], [])
                if r["kernel"] not in kernels:
                    kernels.append(r["kernel"])
        return out

    def clear(self) -> None:
        """Forget every record."""
        with self._lock:
            for counter, _, _ in self._counters:
                counter.take()
            self._records.clear()
            self._per_op.clear()

    def __len__(self) -> int:
        with self._lock:
            self._flush()
            return len(self._records)

    def to_report(self) -> dict:
        """The log in the explain report format of :mod:`xpuruntime.report` (engine ``"pytorch"``)."""
        records = self.records
        devices = sorted({r["device"] for r in records})
        notes = []
        if self._policy_text:
            notes.append(self._policy_text)
        if self._exec_policy_text:
            notes.append(self._exec_policy_text)
        return {
            "schema": _report.SCHEMA,
            "xpuruntime_version": __version__,
            "model": None,
            "engine": "pytorch",
            "engine_reason": "PyTorch runs the model; xpuruntime.pytorch routes matmul/linear, conv2d and "
                             "attention calls to the kernels the KernelPolicy names",
            "device": ", ".join(devices) if devices else "-",
            "inputs": [],
            "outputs": [],
            "options": [],
            "policy_notes": notes,
            "nodes": records,
            # Routed calls exchange tensors zero-copy through DLPack on torch's current stream: no copies, no syncs.
            "transfers": {"items": [], "summary": _report._transfer_summary([]), "reported_by_engine": True},
            "memory": {"text": "outputs and workspaces come from PyTorch's caching allocator", "plan": None},
            "run": {"calls": sum(r["calls"] for r in records)},
            "timeline": {"source": "none", "events": []},
            "summary": None,
        }

    def to_json(self, indent: Optional[int] = 2) -> str:
        return _report.render_json(self.to_report(), indent=indent)

    def to_text(self, candidates: bool = True) -> str:
        """The text report (``candidates``: list every rejected candidate with its reason), then each call site's
        count and signature."""
        lines = _report.render_text(self.to_report(), candidates=candidates).rstrip("\n").split("\n")
        calls = ["", "calls:"] + [f"  {r['node']}: {r['calls']} x {r['signature']}" +
                                  (f"; backward: {r['backward']}" if r["backward"] else "") for r in self.records]
        return "\n".join(lines + calls) + "\n"

    def to_html(self, title: Optional[str] = None) -> str:
        return _report.render_html(self.to_report(), title=title or "xpuruntime.pytorch decision log")

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        with self._lock:
            self._flush()
            calls = sum(r["calls"] for r in self._records.values())
            return f"<DecisionLog {len(self._records)} call sites, {calls} calls>"
