"""What KernelPolicy and ExecutionPolicy share: construction from the C++ object, JSON/YAML and files, equality."""

from __future__ import annotations

from pathlib import Path
from typing import Union


class SerializablePolicy:
    """Mixin over a pybind11 policy class ``_core_class`` with ``assign``, ``_from_json``, ``_from_yaml``,
    ``_load``, ``save`` and ``__eq__``/``__repr__``."""

    _core_class: type

    @classmethod
    def _wrap(cls, core):
        out = cls()
        out.assign(core)
        return out

    def copy(self):
        """An independent copy."""
        return self._wrap(self)

    @classmethod
    def from_json(cls, text: str):
        """Parse (and validate) a policy from JSON text."""
        return cls._wrap(cls._core_class._from_json(text))

    @classmethod
    def from_yaml(cls, text: str):
        """Parse (and validate) a policy from YAML text."""
        return cls._wrap(cls._core_class._from_yaml(text))

    @classmethod
    def load(cls, path: Union[str, Path]):
        """Load a policy file (``.json``, ``.yaml`` or ``.yml``)."""
        return cls._wrap(cls._core_class._load(str(path)))

    def save(self, path: Union[str, Path]) -> None:
        """Save in canonical form; the format follows the extension (``.json``, ``.yaml``, ``.yml``)."""
        self._core_class.save(self, str(path))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, self._core_class) and self._core_class.__eq__(self, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return self._core_class.__repr__(self)
