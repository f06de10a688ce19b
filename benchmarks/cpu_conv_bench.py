"""Single convolutions and the tiny suite's CNNs on the CPU: the native engine against ONNX Runtime in the same
process (issue 42, "no kernel off a cliff"). Each convolution row is a Conv + Relu model at the shapes of the tiny
suite's ResNet (32x32 inputs: planes of 16x16 down to 1x1, where a 3x3 window over a 1x1 plane reads mostly
padding), each model row one of models/suite/tiny's float32 dynamo exports at batch 1. Each session is timed as the
median of --iterations calls of session.run (numpy in, numpy out), best of --repeat rounds, the engines interleaved
round by round so that a busy machine slows both.

    .venv/bin/python benchmarks/cpu_conv_bench.py [--iterations 500] [--repeat 3] [--threads 1]
        [--models resnet,efficientnet,mobilenet_v3,convnext,regnet] [--depthwise] [--no-convs] [--markdown out.md]

--threads is both sessions' ExecutionPolicy(intra_op_threads=) (0: each engine's default). Needs the onnxruntime
engine (scripts/setup.sh fetches it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from typing import Dict, List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src", "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from cpu_pool_bench import finish, median_us, sessions  # noqa: E402

# (input channels, output channels, plane, kernel, stride, pad): the tiny ResNet's convolutions.
CONVS = [(3, 64, 32, 7, 2, 3), (64, 8, 8, 3, 1, 1), (8, 8, 8, 3, 1, 1), (64, 8, 8, 1, 1, 0), (16, 32, 4, 3, 2, 1),
         (32, 32, 2, 3, 1, 1), (32, 64, 2, 3, 2, 1), (64, 64, 1, 3, 1, 1)]


def conv_model(c: int, o: int, plane: int, k: int, stride: int, pad: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.1, (o, c, k, k)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, o).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[stride] * 2,
                              pads=[pad] * 4),
             helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, plane, plane])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], initializer=[w, b])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


# Depthwise convolutions (channels, plane, kernel, stride, activation): the tiny EfficientNet's, whose outputs
# shrink to 2x2 and 1x1 (Note [Depthwise convolution of small planes]), and two MobileNet-sized planes at 224x224
# input with each fused activation (Note [Vectorised SiLU in convolution epilogues]).
DEPTHWISE = [(48, 16, 3, 2, "silu"), (48, 8, 5, 2, "silu"), (96, 4, 3, 2, "silu"), (144, 2, 5, 1, "silu"),
             (192, 2, 5, 2, "silu"), (288, 1, 3, 1, "silu"), (96, 56, 3, 1, "relu"), (96, 56, 3, 1, "silu"),
             (96, 56, 3, 1, "hard_swish"), (32, 112, 3, 1, "silu")]


def depthwise_model(c: int, plane: int, k: int, stride: int, activation: str) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.1, (c, 1, k, k)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, c).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[stride] * 2,
                              pads=[k // 2] * 4, group=c)]
    if activation == "silu":  # as exporters write it: x * sigmoid(x)
        nodes += [helper.make_node("Sigmoid", ["y"], ["s"]), helper.make_node("Mul", ["y", "s"], ["z"])]
    else:
        nodes.append(helper.make_node("HardSwish" if activation == "hard_swish" else "Relu", ["y"], ["z"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, plane, plane])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], initializer=[w, b])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def feeds_of(session) -> Dict[str, np.ndarray]:
    """Batch-1 random feeds for every input (other dynamic dims 1; integer inputs small ids)."""
    rng = np.random.default_rng(0)
    out = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        integer = "int" in str(i.type)
        out[i.name] = rng.integers(0, 10, shape).astype(np.int64) if integer else rng.random(shape, np.float32)
    return out


def compare(native, ort, feeds, args) -> Dict[str, float]:
    best = {"native": float("inf"), "ort": float("inf")}
    for _ in range(args.repeat):
        for name, session in (("native", native), ("ort", ort)):
            median_us(session, feeds, 10)
            best[name] = min(best[name], median_us(session, feeds, args.iterations))
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of both engines (0: defaults)")
    parser.add_argument("--models", default="resnet,efficientnet,mobilenet_v3,convnext,regnet")
    parser.add_argument("--depthwise", action="store_true", help="also the DEPTHWISE convolutions")
    parser.add_argument("--no-convs", action="store_true", help="leave out the CONVS rows")
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    now = datetime.datetime.now(datetime.timezone.utc)
    lines: List[str] = [
        f"{now:%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"intra-op threads {args.threads or 'default'}; median us of {args.iterations} calls, "
        f"best of {args.repeat} interleaved rounds",
        "",
        "| what | native us | ONNX Runtime us | native / ORT |",
        "| --- | ---: | ---: | ---: |",
    ]

    def row(what: str, best: Dict[str, float]) -> None:
        lines.append(f"| {what} | {best['native']:.1f} | {best['ort']:.1f} | {best['native'] / best['ort']:.2f} |")
        print(lines[-1], flush=True)

    for c, o, plane, k, stride, pad in [] if args.no_convs else CONVS:
        native, ort = sessions(conv_model(c, o, plane, k, stride, pad), args.threads)
        x = np.random.default_rng(1).random((1, c, plane, plane), np.float32)
        row(f"Conv {c}->{o} {k}x{k}/{stride} pad {pad} on {plane}x{plane} + Relu", compare(native, ort, {"x": x}, args))
    for c, plane, k, stride, activation in DEPTHWISE if args.depthwise else []:
        native, ort = sessions(depthwise_model(c, plane, k, stride, activation), args.threads)
        x = np.random.default_rng(1).random((1, c, plane, plane), np.float32)
        row(f"Depthwise {c}ch {k}x{k}/{stride} on {plane}x{plane} + {activation}", compare(native, ort, {"x": x}, args))
    for name in [m for m in args.models.split(",") if m]:
        path = os.path.join(ROOT, "models", "suite", "tiny", f"{name}.dynamo.float32.onnx")
        native, ort = sessions(path, args.threads)
        row(f"tiny suite {name}", compare(native, ort, feeds_of(native), args))
    finish(lines, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
