"""What SessionOptions change in the model before a session is built: free dimensions fixed, initializers from the
caller, external-data files from memory, and the session options a model carries (``ORT_LOAD_CONFIG_FROM_MODEL``).

Note [Initializers from the caller]
-----------------------------------
ONNX Runtime's ``add_initializer`` / ``add_external_initializers`` hand a session values that replace (or stand in
for the external data of) the model's initializers of those names; ``add_external_initializers_from_files_in_memory``
hands it the contents of external-data files by the names the model gives them. Here the model is rewritten once,
in memory, before the engine sees it: the named initializers get the caller's values as raw data (the dims and the
element type of the value), the external references into the given files get those bytes. Any other external data
is still read from the model file's folder (``external_data_dir``). A name the model does not have is an
``InvalidArgument`` naming the initializers it does have, as in ONNX Runtime. Values are copied when the session is
created, so the caller may drop them afterwards (ONNX Runtime asks the caller to keep them alive).

Note [Options from the model]
----------------------------
With ``ORT_LOAD_CONFIG_FROM_MODEL=1`` ONNX Runtime sets a session's options from the model's ``ort_config``
metadata. This module does that on its own ``SessionOptions`` (so ``get_session_options()`` shows them and each is
mapped as if the caller had set it), then hands the engine the model without that metadata: the ONNX Runtime library
inside the onnxruntime engine reads the same variable and would apply them a second time (its own profiler writing
its own trace file, for one).

Note [Sequences through the compatibility layer]
------------------------------------------------
ONNX Runtime's ``run`` takes and returns sequences (lists of arrays), maps and optionals (``None`` when empty).
xpuruntime's onnxruntime engine exchanges tensors only, and the native engine runs sequences and optionals on the
CPU. So a session given no engine (``"auto"``) on the CPU whose model the onnxruntime engine refuses for an input or
output of such a type is built again on the native engine (the refusal comes before ONNX Runtime runs anything, and
the model is not parsed in Python to find out first); ``explain()`` says so. An engine named explicitly is kept
(and refuses such a model).
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ._errors import InvalidArgument, InvalidGraph, InvalidProtobuf, NoSuchFile

# The options ONNX Runtime reads from a model's "ort_config" metadata (ORT_LOAD_CONFIG_FROM_MODEL=1).
_CONFIG_FIELDS = {"intra_op_num_threads": int, "inter_op_num_threads": int, "graph_optimization_level": int,
                  "execution_mode": int, "enable_profiling": bool, "optimized_model_filepath": str,
                  "enable_mem_pattern": bool, "enable_mem_reuse": bool, "enable_cpu_mem_arena": bool,
                  "profile_file_prefix": str, "use_deterministic_compute": bool, "log_severity_level": int,
                  "log_verbosity_level": int, "logid": str}


def load_proto(model: Union[str, bytes]) -> Any:
    """The ModelProto without its external data; a missing file is ``NoSuchFile``, bytes that are no model
    ``InvalidProtobuf``."""
    import onnx
    if isinstance(model, bytes):
        try:
            return onnx.load_from_string(model)
        except Exception as error:
            raise InvalidProtobuf(f"the model bytes are not an ONNX model: {error}") from None
    if not os.path.isfile(model):
        raise NoSuchFile(f"Load model from {model} failed: File doesn't exist")
    return onnx.load(model, load_external_data=False)


def apply_config_from_model(proto: Any, so: Any) -> List[str]:
    """Sets ``so``'s fields from the model's ``ort_config`` metadata (JSON ``{"session_options": {...}}``), as ONNX
    Runtime does when ``ORT_LOAD_CONFIG_FROM_MODEL=1``; returns what was set, for explain()."""
    text = next((p.value for p in proto.metadata_props if p.key == "ort_config"), None)
    if text is None:
        return []
    try:
        options = json.loads(text).get("session_options", {})
    except (ValueError, AttributeError) as error:
        raise InvalidGraph(f"the model's ort_config metadata is not JSON with a session_options object: {error}") \
            from None
    notes = []
    for key, value in options.items():
        if key not in _CONFIG_FIELDS:
            raise InvalidGraph(f"the model's ort_config sets '{key}', which is not a session option this module "
                               f"reads ({', '.join(sorted(_CONFIG_FIELDS))})")
        setattr(so, key, _CONFIG_FIELDS[key](value))
        notes.append(f"ORT_LOAD_CONFIG_FROM_MODEL: {key}={value} from the model's ort_config")
    return notes


def without_ort_config(proto: Any) -> bytes:
    """The model without its ``ort_config`` metadata (Note [Options from the model])."""
    kept = [p for p in proto.metadata_props if p.key != "ort_config"]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    return proto.SerializeToString()


def _fix_free_dims(proto: Any, so: Any) -> bool:
    changed = False
    for value in itertools.chain(proto.graph.input, proto.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            fixed = so._free_dims_by_name.get(dim.dim_param) if dim.HasField("dim_param") else None
            if fixed is None and dim.denotation:
                fixed = so._free_dims_by_denotation.get(dim.denotation)
            if fixed is not None:
                dim.ClearField("dim_param")
                dim.dim_value = fixed
                changed = True
    return changed


def _set_initializers(proto: Any, values: Dict[str, np.ndarray]) -> None:
    from onnx import numpy_helper
    by_name = {t.name: t for t in proto.graph.initializer}
    for name, array in values.items():
        if name not in by_name:
            raise InvalidArgument(f"add_initializer: the model has no initializer '{name}' (it has: "
                                  f"{', '.join(sorted(by_name)) or 'none'})")
        replacement = numpy_helper.from_array(np.ascontiguousarray(array), name)
        by_name[name].CopyFrom(replacement)


def _read_external_files(proto: Any, files: Dict[str, bytes]) -> None:
    from onnx import TensorProto
    for tensor in proto.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        data = files.get(os.path.normpath(info.get("location", "")))
        if data is None:
            continue
        offset, length = int(info.get("offset", 0)), info.get("length")
        end = offset + int(length) if length is not None else len(data)
        if end > len(data):
            raise InvalidArgument(f"initializer '{tensor.name}': bytes {offset}..{end} are outside the "
                                  f"{len(data)}-byte in-memory file '{info['location']}'")
        tensor.raw_data = data[offset:end]
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT


def prepare_model(model: Union[str, bytes], so: Any) -> Tuple[Union[str, bytes], Optional[str]]:
    """The model the engine gets (the path unchanged, or rewritten bytes) and the folder of its external data
    (the model file's, None for bytes)."""
    rewrite = bool(so._free_dims_by_name or so._free_dims_by_denotation or so._initializers or so._external_files)
    if not rewrite:
        return model, None
    proto = load_proto(model)
    _fix_free_dims(proto, so)
    _read_external_files(proto, so._external_files)
    _set_initializers(proto, so._initializers)
    folder = os.path.dirname(os.path.abspath(model)) if isinstance(model, str) else None
    return proto.SerializeToString(), folder

