"""Post-training quantization: a float ONNX model -> a standard QDQ model (docs/quantization.md).

>>> import xpuruntime as xrt
>>> result = xrt.quantize("model.onnx", calibration=feeds, precision="int8", method="entropy")
>>> result.save("model.int8.onnx")              # QuantizeLinear/DequantizeLinear: any QDQ consumer reads it
>>> result.decisions                            # scales, zero points, excluded nodes: JSON
>>> xrt.quantize("model.onnx", decisions=result.decisions)   # the same bytes, no calibration data
>>> print(xrt.quantization.sensitivity("model.onnx", feeds, eval_feeds))   # the costliest nodes first

Modules: :mod:`.quantizer` (planning and writing the QDQ model), :mod:`.calibration` (activation ranges),
:mod:`.sensitivity` (per-node accuracy cost), :mod:`.session` (``ExecutionPolicy(precision="int8",
calibration=...)`` at session creation, with its cache).
"""

from .calibration import METHODS, collect_ranges, entropy_threshold, percentile_threshold
from .quantizer import (
    DEFAULT_OP_TYPES,
    PRECISIONS,
    SUPPORTED_OP_TYPES,
    QuantizationResult,
    apply_decisions,
    int4_block_scales,
    int8_weight_scales,
    load_decisions,
    plan,
    quantize,
)
from .sensitivity import SensitivityEntry, SensitivityReport, sensitivity

__all__ = [
    "quantize",
    "QuantizationResult",
    "plan",
    "apply_decisions",
    "load_decisions",
    "sensitivity",
    "SensitivityEntry",
    "SensitivityReport",
    "collect_ranges",
    "entropy_threshold",
    "percentile_threshold",
    "int8_weight_scales",
    "int4_block_scales",
    "METHODS",
    "PRECISIONS",
    "DEFAULT_OP_TYPES",
    "SUPPORTED_OP_TYPES",
]
