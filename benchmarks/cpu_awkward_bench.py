"""Single nodes at awkward shapes on the CPU: xpuruntime's native engine against ONNX Runtime's CPU EP, in one run on
one machine (issue 42, item 2: no kernel off a cliff; docs/benchmarks.md "The CPU engine at awkward shapes").

Each case is one ONNX node on float32 inputs shaped to leave the paths a kernel was written for: reductions and
softmax over a first or middle axis, one huge row, prime sizes, many tiny inputs, GEMV-like products, the ops the
native engine once ran on the ONNX reference library (CumSum, ArgMax, TopK, LogSoftmax, Pad's other modes). A case
whose native time is several times ONNX Runtime's is a cliff: a kernel that falls back to a path far slower than
its bytes need. Timing, interleaving and the table are benchmarks/cpu_suite_bench.py's (its `op:` cases).

    .venv/bin/python benchmarks/cpu_awkward_bench.py [--cases reduce_sum_axis0,pad_reflect] [--rounds 3]
        [--calls 10] [--threads 0] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import sys
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import cpu_suite_bench  # noqa: E402  (the timing and table of the CPU benchmarks)

FLOAT = 1  # onnx.TensorProto.FLOAT


def _model(nodes, inputs: Sequence[Tuple[str, Sequence[int]]], inits=(), opset: int = 18) -> bytes:
    """A model of `nodes` whose outputs' types come from ONNX's shape inference."""
    import onnx
    from onnx import helper
    graph = helper.make_graph(nodes, "awkward", [helper.make_tensor_value_info(n, FLOAT, list(s)) for n, s in inputs],
                              [helper.make_tensor_value_info(o, 0, None) for o in nodes[-1].output], list(inits))
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))
    inferred = {v.name: v for v in model.graph.value_info}
    for output in model.graph.output:
        if output.name in inferred:
            output.CopyFrom(inferred[output.name])
        elif output.type.tensor_type.elem_type == 0:  # an op newer than this ONNX's inference (Mish): float32 in, out
            output.type.tensor_type.elem_type = FLOAT
    return model.SerializeToString()


def _ints(name: str, values: Sequence[int]):
    from onnx import TensorProto, helper
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], list(values))


def _x(shape: Sequence[int], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(tuple(shape)).astype(np.float32)


def reduce(op: str, shape, axes, keepdims: int = 0):
    from onnx import helper
    node = helper.make_node(op, ["x"] + (["axes"] if axes is not None else []), ["y"], keepdims=keepdims)
    return _model([node], [("x", shape)], [_ints("axes", axes)] if axes is not None else []), {"x": _x(shape)}


def unary(op: str, shape, **attrs):
    from onnx import helper
    return _model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", shape)]), {"x": _x(shape)}


def binary(op: str, a_shape, b_shape):
    from onnx import helper
    return (_model([helper.make_node(op, ["a", "b"], ["y"])], [("a", a_shape), ("b", b_shape)]),
            {"a": _x(a_shape), "b": _x(b_shape, 1)})


def with_constant(op: str, shape, constant: np.ndarray, outputs=("y",), **attrs):
    """One node of x and a constant second input (CumSum's axis, TopK's k, Pad's pads, Gather's indices)."""
    from onnx import helper, numpy_helper
    node = helper.make_node(op, ["x", "c"], list(outputs), **attrs)
    return _model([node], [("x", shape)], [numpy_helper.from_array(constant, "c")]), {"x": _x(shape)}


def gather(shape, axis: int, count: int):
    indices = np.random.default_rng(2).integers(0, shape[axis], size=count).astype(np.int64)
    return with_constant("Gather", shape, indices, axis=axis)


def concat(shapes, axis: int):
    from onnx import helper
    names = [f"x{i}" for i in range(len(shapes))]
    return (_model([helper.make_node("Concat", names, ["y"], axis=axis)], list(zip(names, shapes))),
            {n: _x(s, i) for i, (n, s) in enumerate(zip(names, shapes))})


def transpose(shape, perm):
    return unary("Transpose", shape, perm=list(perm))


def conv(n, c, hw, k, kernel, stride, group, dilation=1):
    from onnx import helper, numpy_helper
    w = (_x((k, c // group, kernel, kernel), 3) * 0.1).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride] * 2, group=group, dilations=[dilation] * 2,
                            pads=[kernel // 2 * dilation] * 4)
    return _model([node], [("x", (n, c) + tuple(hw))], [numpy_helper.from_array(w, "w")]), {"x": _x((n, c) + tuple(hw))}


CASES: Dict[str, Tuple[str, Callable]] = {
    "reduce_sum_axis0": ("ReduceSum over axis 0 of [1009, 1013]", lambda: reduce("ReduceSum", (1009, 1013), [0])),
    "reduce_sum_mid": ("ReduceSum over axis 1 of [64, 997, 64]", lambda: reduce("ReduceSum", (64, 997, 64), [1])),
    "reduce_mean_0_2": ("ReduceMean over axes 0, 2 of [31, 257, 129]",
                        lambda: reduce("ReduceMean", (31, 257, 129), [0, 2])),
    "reduce_max_row": ("ReduceMax of one row of 4,000,037", lambda: reduce("ReduceMax", (1, 1, 4000037), [2])),
    "reduce_l2_rows": ("ReduceL2 over rows of 3, [100003, 3]", lambda: reduce("ReduceL2", (100003, 3), [1])),
    "reduce_sum_5d": ("ReduceSum of all of [7, 11, 13, 17, 19]",
                      lambda: reduce("ReduceSum", (7, 11, 13, 17, 19), None)),
    "reduce_log_sum_exp_axis0": ("ReduceLogSumExp over axis 0 of [4099, 257]",
                                 lambda: reduce("ReduceLogSumExp", (4099, 257), [0])),
    "instance_norm_mean": ("ReduceMean over H, W of [2, 67, 131, 137], keepdims",
                           lambda: reduce("ReduceMean", (2, 67, 131, 137), [2, 3], 1)),
    "softmax_axis0": ("Softmax over axis 0 of [4099, 257]", lambda: unary("Softmax", (4099, 257), axis=0)),
    "softmax_mid": ("Softmax over axis 1 of [17, 4099, 31]", lambda: unary("Softmax", (17, 4099, 31), axis=1)),
    "softmax_long_row": ("Softmax of one row of 2,000,003", lambda: unary("Softmax", (1, 2000003), axis=-1)),
    "log_softmax_vocab": ("LogSoftmax over rows of 50,257 (64 rows)",
                          lambda: unary("LogSoftmax", (64, 50257), axis=-1)),
    "arg_max_axis0": ("ArgMax over axis 0 of [4099, 1001]", lambda: unary("ArgMax", (4099, 1001), axis=0, keepdims=0)),
    "arg_max_row": ("ArgMax of one row of 3,000,017", lambda: unary("ArgMax", (1, 3000017), axis=1, keepdims=0)),
    "cum_sum_axis0": ("CumSum over axis 0 of [4099, 1001]",
                      lambda: with_constant("CumSum", (4099, 1001), np.array(0, np.int64))),
    "cum_sum_row": ("CumSum of one row of 4,000,037",
                    lambda: with_constant("CumSum", (1, 4000037), np.array(1, np.int64))),
    "top_k_axis0": ("TopK 5 over axis 0 of [100003, 7]",
                    lambda: with_constant("TopK", (100003, 7), np.array([5], np.int64), ("y", "i"), axis=0)),
    "top_k_row": ("TopK 1000 of one row of 4,000,037",
                  lambda: with_constant("TopK", (1, 4000037), np.array([1000], np.int64), ("y", "i"), axis=1)),
    "top_k_rows": ("TopK 7 over rows of 1031 (4096 rows)",
                   lambda: with_constant("TopK", (4096, 1031), np.array([7], np.int64), ("y", "i"), axis=1)),
    "transpose_021": ("Transpose [257, 263, 269] to (0, 2, 1)", lambda: transpose((257, 263, 269), (0, 2, 1))),
    "transpose_210": ("Transpose [129, 131, 137] to (2, 1, 0)", lambda: transpose((129, 131, 137), (2, 1, 0))),
    "transpose_5d": ("Transpose [3, 31, 37, 5, 41] to (0, 3, 1, 4, 2)",
                     lambda: transpose((3, 31, 37, 5, 41), (0, 3, 1, 4, 2))),
    "gather_columns": ("Gather 777 of 4099 columns, [1000, 4099]", lambda: gather((1000, 4099), 1, 777)),
    "gather_rows": ("Gather 4097 rows of [50257, 768]", lambda: gather((50257, 768), 0, 4097)),
    "matmul_gemv": ("MatMul [1, 4099] x [4099, 4093]", lambda: binary("MatMul", (1, 4099), (4099, 4093))),
    "matmul_tall": ("MatMul [100003, 7] x [7, 5]", lambda: binary("MatMul", (100003, 7), (7, 5))),
    "matmul_batched_tiny": ("MatMul [997, 3, 13] x [997, 13, 17]",
                            lambda: binary("MatMul", (997, 3, 13), (997, 13, 17))),
    "matmul_broadcast": ("MatMul [64, 129, 67] x [67, 131]", lambda: binary("MatMul", (64, 129, 67), (67, 131))),
    "matmul_long_k": ("MatMul [3, 1000003] x [1000003, 3]", lambda: binary("MatMul", (3, 1000003), (1000003, 3))),
    "add_outer": ("Add [4099, 1] + [1, 4097]", lambda: binary("Add", (4099, 1), (1, 4097))),
    "mul_interleaved": ("Mul [31, 1, 257, 1] x [1, 129, 1, 67]",
                        lambda: binary("Mul", (31, 1, 257, 1), (1, 129, 1, 67))),
    "concat_many_small": ("Concat of 8 [31, 37, n] along the last axis",
                          lambda: concat([(31, 37, n) for n in (1, 3, 5, 7, 11, 13, 17, 19)], 2)),
    "concat_axis0": ("Concat of [4099, 1001], [3, 1001], [1, 1001] along axis 0",
                     lambda: concat([(4099, 1001), (3, 1001), (1, 1001)], 0)),
    "pad_reflect": ("Pad reflect of [1, 67, 131, 137] by (3, 5) x (7, 2)",
                    lambda: with_constant("Pad", (1, 67, 131, 137), np.array([0, 0, 3, 5, 0, 0, 7, 2], np.int64),
                                          mode="reflect")),
    "pad_edge_5d": ("Pad edge of [3, 5, 31, 37, 41] by 0-4 on each side",
                    lambda: with_constant("Pad", (3, 5, 31, 37, 41),
                                          np.array([0, 1, 2, 3, 4, 0, 1, 2, 3, 4], np.int64), mode="edge")),
    "conv_dilated": ("Conv 3x3 dilation 3, 67 -> 71 channels at 131x137",
                     lambda: conv(1, 67, (131, 137), 71, 3, 1, 1, 3)),
    "conv_grouped_odd": ("Conv 3x3 stride 2, 7 groups, 63 -> 77 channels at 97x89",
                         lambda: conv(1, 63, (97, 89), 77, 3, 2, 7)),
    "conv_1x1_wide": ("Conv 1x1, 1001 -> 1003 channels at 7x7", lambda: conv(1, 1001, (7, 7), 1003, 1, 1, 1)),
    "tile": ("Tile [64, 1, 512] by (1, 64, 1)",
             lambda: with_constant("Tile", (64, 1, 512), np.array([1, 64, 1], np.int64))),
    "gather_elements": ("GatherElements along axis 1 of [256, 1024]", lambda: _gather_elements((256, 1024), 1)),
    "elu": ("Elu of [1, 64, 112, 112]", lambda: unary("Elu", (1, 64, 112, 112))),
    "mish": ("Mish of [1, 64, 112, 112]", lambda: unary("Mish", (1, 64, 112, 112))),
    "softplus": ("Softplus of [1, 64, 112, 112]", lambda: unary("Softplus", (1, 64, 112, 112))),
    "instance_norm": ("InstanceNormalization of [2, 64, 128, 128]", lambda: _instance_norm((2, 64, 128, 128))),
    "layer_norm_narrow": ("LayerNormalization over rows of 7 (4099 rows)", lambda: _layer_norm((4099, 7), 1)),
    "layer_norm_planes": ("LayerNormalization over axes 1-2 of [67, 131, 137]", lambda: _layer_norm((67, 131, 137), 1)),
}


def _layer_norm(shape, axis: int):
    from onnx import helper, numpy_helper
    tail = tuple(shape[axis:])
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=axis)
    return _model([node], [("x", shape)], [numpy_helper.from_array(np.ones(tail, np.float32), "g"),
                                           numpy_helper.from_array(np.zeros(tail, np.float32), "b")]), {"x": _x(shape)}


def _gather_elements(shape, axis: int):
    indices = np.random.default_rng(4).integers(0, shape[axis], size=shape).astype(np.int64)
    return with_constant("GatherElements", shape, indices, axis=axis)


def _instance_norm(shape):
    from onnx import helper, numpy_helper
    channels = shape[1]
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])
    scale, bias = np.ones(channels, np.float32), np.zeros(channels, np.float32)
    inits = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(bias, "b")]
    return _model([node], [("x", shape)], inits), {"x": _x(shape)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="", help=f"comma-separated names (default: all): {', '.join(CASES)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="intra_op_threads of both engines (0: their default)")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    names = [c for c in args.cases.split(",") if c] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    cpu_suite_bench.OPS.update({f"awkward_{name}": CASES[name] for name in names})
    variants = ["native", "onnxruntime"]
    print(f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
          f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    rows: List[Dict] = []
    for name in names:
        row = cpu_suite_bench.run_case(f"op:awkward_{name}", variants, args.rounds, args.calls, args.warmup,
                                       threads=args.threads)
        row["what"] = f"{name}: {row['what']}"
        rows.append(row)
        print(f"  {name}: native {row['native']:.3f} ms, onnxruntime {row['onnxruntime']:.3f} ms", flush=True)
    table = cpu_suite_bench.markdown(rows, variants)
    cliffs = [r for r in rows if r["native"] > 2.0 * r["onnxruntime"]]
    table += f"\n\ncases where native takes more than twice ONNX Runtime's time: {len(cliffs)} of {len(rows)}" + \
        (" (" + ", ".join(r["what"].split(":")[0] for r in cliffs) + ")" if cliffs else "")
    print()
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
