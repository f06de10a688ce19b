"""ONNX Runtime's ``capi.onnxruntime_inference_collection``: the session classes and
``check_and_normalize_provider_args``."""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import InferenceSession, IOBinding, ModelMetadata, NodeArg, OrtValue, SparseTensor
from .._errors import InvalidArgument

__all__ = ["InferenceSession", "IOBinding", "ModelMetadata", "NodeArg", "OrtValue", "SparseTensor",
           "check_and_normalize_provider_args"]


class _ArgumentError(InvalidArgument):
    """A providers/provider_options argument of the wrong form (a ValueError, as in ONNX Runtime)."""


def check_and_normalize_provider_args(providers: Optional[Sequence[Any]],
                                      provider_options: Optional[Sequence[Dict[Any, Any]]],
                                      available_provider_names: Sequence[str]
                                      ) -> Tuple[List[str], List[Dict[str, str]]]:
    """ONNX Runtime's normalisation of ``providers`` (names or ``(name, options)`` tuples) and
    ``provider_options`` (one dict per provider) into a list of names and a list of string-valued option dicts.
    A provider listed twice keeps its first place and options, with a warning; malformed arguments raise a
    ``ValueError`` (an ``InvalidArgument``). Names are not checked against ``available_provider_names`` (ONNX
    Runtime does not either)."""
    if providers is None:
        return [], []
    if not isinstance(providers, (list, tuple)):
        raise _ArgumentError("'providers' should be a sequence.")
    if provider_options is not None and not isinstance(provider_options, (list, tuple)):
        raise _ArgumentError("'provider_options' should be a sequence.")
    if provider_options is not None and len(providers) != len(provider_options):
        raise _ArgumentError("'providers' and 'provider_options' should be the same length if both are given.")
    names: List[str] = []
    options: List[Dict[str, str]] = []

    def add(name: str, values: Dict[Any, Any]) -> None:
        if name in names:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", UserWarning, stacklevel=3)
            return
        names.append(name)
        options.append({str(k): str(v) for k, v in values.items()})

    for i, provider in enumerate(providers):
        if isinstance(provider, tuple):
            if provider_options is not None:
                raise _ArgumentError("Only one way of specifying provider options should be used: (name, options) "
                                     "tuples in 'providers' or 'provider_options'.")
            if len(provider) != 2 or not isinstance(provider[0], str) or not isinstance(provider[1], dict):
                raise _ArgumentError("Each provider tuple should be (name: str, options: dict).")
            add(provider[0], provider[1])
        elif isinstance(provider, str):
            values = {} if provider_options is None else provider_options[i]
            if not isinstance(values, dict):
                raise _ArgumentError("Each element of 'provider_options' should be a dict.")
            add(provider, values)
        else:
            raise _ArgumentError("'providers' values must be either strings or (string, dict) tuples.")
    return names, options
