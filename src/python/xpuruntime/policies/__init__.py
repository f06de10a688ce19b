"""Policies: which kernel runs each op (:class:`KernelPolicy`) and how a run executes (:class:`ExecutionPolicy`).

Both are explicit, serializable (JSON and YAML, canonical: the same policy always gives the same bytes) and
validated against the kernel registry, with errors that list the valid choices. See ``docs/policies.md``.
"""

from .execution_policy import ExecutionPolicy
from .kernel_policy import KernelPolicy, pinned, preferred

__all__ = ["KernelPolicy", "ExecutionPolicy", "pinned", "preferred"]
