"""Generates the example models shipped in this folder (run it again to re-create them byte for byte).

    tiny_classifier.onnx   x[batch, 8] -> Gemm(8x16) -> Relu -> Gemm(16x4) -> Softmax -> probs[batch, 4]
                           fixed-seed weights; opset 17, IR version 8 (readable by ONNX Runtime 1.16+)

Needs Debian's python3-onnx (1.12).
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = pathlib.Path(__file__).resolve().parent


def tiny_classifier() -> onnx.ModelProto:
    rng = np.random.default_rng(2026)
    w1 = (rng.standard_normal((8, 16)) * 0.5).astype(np.float32)
    b1 = (rng.standard_normal(16) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((16, 4)) * 0.5).astype(np.float32)
    b2 = (rng.standard_normal(4) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="relu1"),
        helper.make_node("Gemm", ["a", "w2", "b2"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
         numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(b2, "b2")])
    model = helper.make_model(graph, producer_name="xpuruntime-examples", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    path = HERE / "tiny_classifier.onnx"
    path.write_bytes(tiny_classifier().SerializeToString())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
