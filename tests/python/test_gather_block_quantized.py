"""ONNX Runtime's com.microsoft GatherBlockQuantized (quantized embedding tables): the reference kernel against a numpy
dequantize-then-gather and against ONNX Runtime's own CPU kernel on the same file, over uint8 with 4 and 8 bits (zero
points packed or absent), int4/uint4 and float8 data, other gather and quantize axes, negative and out-of-range
indices and float16 scales; malformed nodes fail with typed errors naming what is wrong; and a table that ONNX
Runtime's own quantizer wrote (MatMulNBitsQuantizer with Gather in its op types, where onnxruntime's Python package
is installed)."""

import numpy as np
import pytest

import xpuruntime as xrt

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

# ONNX's data_type codes of the types this onnx (Debian's is 1.12) may not name.
FLOAT8E4M3FN, UINT4, INT4 = 17, 21, 22


def raw_tensor(name, data_type, dims, raw):
    """A TensorProto of `data_type` holding `raw` bytes (int4/uint4: two values a byte, low nibble first)."""
    t = TensorProto()
    t.name = name
    t.data_type = data_type
    t.dims.extend(dims)
    t.raw_data = bytes(raw)
    return t


def nibbles(values):
    """int4/uint4 values packed two a byte, low nibble first, as ONNX stores them."""
    flat = (np.asarray(values).astype(np.int64).flatten() & 0xF).astype(np.uint8)
    return pack(flat[None, :], 4)[0]


def e4m3fn(values):
    """float8e4m3fn bytes of `values`, each a normal number with at most 3 mantissa bits (exact)."""
    out = []
    for v in np.asarray(values, np.float64).flatten():
        e = int(np.floor(np.log2(abs(v))))
        m = abs(v) / 2.0 ** e - 1
        assert -6 <= e <= 8 and m * 8 == int(m * 8), v
        out.append((0x80 if v < 0 else 0) | (e + 7) << 3 | int(m * 8))
    return np.array(out, np.uint8)


def pack(codes, bits):
    """Codes [..., n] (n a multiple of 8 / bits after padding) packed along the last axis, low bits first."""
    per = 8 // bits
    pad = (-codes.shape[-1]) % per
    codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (pad,), codes.dtype)], -1).astype(np.uint8)
    out = np.zeros(codes.shape[:-1] + (codes.shape[-1] // per,), np.uint8)
    for k in range(per):
        out |= (codes[..., k::per] << (k * bits)).astype(np.uint8)
    return out


def expand(params, axis, block, size):
    """Per-block parameters repeated to one a value along `axis` (cut to `size`)."""
    return np.take(np.repeat(params, block, axis=axis), np.arange(size), axis=axis)


def model(data, scales, zero_points, indices_shape, out_type, **attrs):
    inits = [numpy_helper.from_array(data, "data") if isinstance(data, np.ndarray) else data,
             numpy_helper.from_array(scales, "scales")]
    inputs = ["data", "idx", "scales"]
    if zero_points is not None:
        inits.append(numpy_helper.from_array(zero_points, "zp") if isinstance(zero_points, np.ndarray)
                     else zero_points)
        inputs.append("zp")
    node = helper.make_node("GatherBlockQuantized", inputs, ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], "gbq", [helper.make_tensor_value_info("idx", TensorProto.INT64, indices_shape)],
                              [helper.make_tensor_value_info("y", out_type, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def run(model_bytes, indices, engine="native"):
    session = xrt.InferenceSession(model_bytes, engine=engine, device="cpu")
    return session.run(None, {"idx": indices})[0]


def want_gather(table, indices, axis):
    rows = table.shape[axis]
    out = np.take(table, np.clip(np.where(indices < 0, indices + rows, indices), 0, rows - 1), axis=axis)
    bad = (indices < -rows) | (indices >= rows)
    if bad.any():  # out-of-range indices give zeros
        mask = np.expand_dims(bad, tuple(range(indices.ndim, indices.ndim + table.ndim - 1 - axis)))
        mask = mask.reshape((1,) * axis + mask.shape)
        out = np.where(mask, 0, out)
    return out


@pytest.mark.parametrize("bits,with_zero_points,block", [(4, True, 16), (4, False, 32), (8, True, 16), (8, False, 64)])
def test_uint8_tables_dequantize_what_they_gather(bits, with_zero_points, block):
    rng = np.random.default_rng(bits * 10 + block)
    rows, cols = 11, 96  # 6, 3 or ~2 blocks a row: an odd count of zero points packs into a partly used byte
    codes = rng.integers(0, 1 << bits, (rows, cols)).astype(np.uint8)
    nblocks = -(-cols // block)
    scales = rng.uniform(0.01, 0.2, (rows, nblocks)).astype(np.float32)
    zp = rng.integers(0, 1 << bits, (rows, nblocks)).astype(np.uint8)
    data = pack(codes, bits) if bits < 8 else codes
    zp_in = (pack(zp, bits) if bits < 8 else zp) if with_zero_points else None
    indices = np.array([[3, -1, 0, 10], [5, 5, -11, 2]], np.int64)
    m = model(data, scales, zp_in, list(indices.shape), TensorProto.FLOAT, bits=bits, block_size=block)
    zero = expand(zp, 1, block, cols).astype(np.float32) if with_zero_points else float(1 << (bits - 1))
    table = (codes.astype(np.float32) - zero) * expand(scales, 1, block, cols)
    want = want_gather(table, indices, 0)
    got = run(m, indices)
    assert got.shape == (2, 4, cols) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run(m, indices, "onnxruntime"), got)


def test_other_axes_float16_scales_and_out_of_range_indices():
    """uint4 data (one code a value) gathered along axis 1 and quantized along axis 0 of a 3-D table, float16 scales
    and output; an index past either end gives zeros."""
    rng = np.random.default_rng(7)
    shape, block = (32, 5, 3), 16
    codes = rng.integers(0, 16, shape).astype(np.uint8)
    scales = rng.uniform(0.05, 0.5, (2, 5, 3)).astype(np.float16)
    zp = rng.integers(0, 16, (2, 5, 3)).astype(np.uint8)
    data = raw_tensor("data", UINT4, shape, nibbles(codes))
    zero_points = raw_tensor("zp", UINT4, zp.shape, nibbles(zp))
    indices = np.array([4, -5, 7, 2, -6], np.int64)
    m = model(data, scales, zero_points, [5], TensorProto.FLOAT16, bits=4, block_size=block, gather_axis=1,
              quantize_axis=0)
    table = ((codes.astype(np.float32) - expand(zp, 0, block, 32)) * expand(scales.astype(np.float32), 0, block, 32))
    want = want_gather(table.astype(np.float16), indices, 1)
    got = run(m, indices)
    assert got.shape == (32, 5, 3) and got.dtype == np.float16
    np.testing.assert_array_equal(got, want)
    assert not got[:, [2, 4], :].any()  # 7 and -6 are outside [-5, 5)


def test_int4_without_zero_points_is_symmetric():
    rng = np.random.default_rng(8)
    codes = rng.integers(-8, 8, (6, 32)).astype(np.int8)
    scales = rng.uniform(0.1, 1.0, (6, 2)).astype(np.float32)
    data = raw_tensor("data", INT4, codes.shape, nibbles(codes))
    indices = np.array([[0], [5], [-2]], np.int64)
    got = run(model(data, scales, None, [3, 1], TensorProto.FLOAT, block_size=16), indices)
    np.testing.assert_array_equal(got, want_gather(codes * expand(scales, 1, 16, 32), indices, 0))


def test_float8_tables_with_one_block_a_row_and_a_broadcast_scale():
    rng = np.random.default_rng(9)
    values = rng.choice([-3.0, -1.75, -1.0, -0.5, 0.625, 1.25, 1.5, 2.0, 3.5], (4, 16))  # exact in e4m3fn
    data = raw_tensor("data", FLOAT8E4M3FN, values.shape, e4m3fn(values))
    scales = rng.uniform(0.5, 2.0, (4, 1)).astype(np.float32)  # block_size 0: one block a row
    got = run(model(data, scales, None, [3], TensorProto.FLOAT, block_size=0), np.array([2, 0, -1], np.int64))
    np.testing.assert_array_equal(got, (values * scales).astype(np.float32)[[2, 0, 3]])
    scale = np.array([[0.5]], np.float32)  # one scale for the whole table: a dimension of 1 broadcasts
    got = run(model(data, scale, None, [2], TensorProto.FLOAT, block_size=0), np.array([1, 3], np.int64))
    np.testing.assert_array_equal(got, (values * 0.5).astype(np.float32)[[1, 3]])
    info = pytest.raises(xrt.XpuRuntimeError, run, model(data, scales, np.zeros((4, 1), np.uint8), [1],
                                                           TensorProto.FLOAT, block_size=0), np.array([0]))
    assert "float8 data takes no 'zero_points'" in str(info.value)


def test_malformed_nodes_fail_with_typed_errors():
    rng = np.random.default_rng(10)
    data = rng.integers(0, 256, (4, 16)).astype(np.uint8)
    scales = np.ones((4, 2), np.float32)
    idx = np.array([0], np.int64)

    def error(m):
        with pytest.raises(xrt.XpuRuntimeError) as info:
            run(m, idx)
        return info

    info = error(model(data, scales, None, [1], TensorProto.FLOAT, bits=3, block_size=16))
    assert "bits must be 2, 4 or 8" in str(info.value)
    info = error(model(data, scales, None, [1], TensorProto.FLOAT, bits=4, block_size=24))
    assert "block_size must be a power of two >= 16" in str(info.value)
    info = error(model(data, np.ones((4, 3), np.float32), None, [1], TensorProto.FLOAT, bits=4, block_size=16))
    assert "'scales' [4,3] must be 2 along axis 1" in str(info.value)
    info = error(model(data, scales, None, [1], TensorProto.FLOAT, bits=4, block_size=16, gather_axis=1))
    assert "gather_axis must be 0 for uint8 data" in str(info.value)
    info = error(model(data.astype(np.int8), scales, None, [1], TensorProto.FLOAT, bits=4, block_size=16))
    assert isinstance(info.value, xrt.InvalidTypeError) and "must be uint8, int4, uint4 or a float8" in str(info.value)


def test_a_table_onnxruntimes_quantizer_wrote():
    """An embedding table quantized by ONNX Runtime's own MatMulNBitsQuantizer (Gather in op_types_to_quantize): the
    native engine gathers what ONNX Runtime gathers from the same file."""
    pytest.importorskip("onnxruntime")
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    except ImportError:
        pytest.skip("this onnxruntime has no MatMulNBitsQuantizer with weight-only configs")
    rng = np.random.default_rng(11)
    table = rng.standard_normal((50, 64)).astype(np.float32)
    node = helper.make_node("Gather", ["table", "idx"], ["y"], axis=0)
    graph = helper.make_graph([node], "emb", [helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(table, "table")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False, op_types_to_quantize=("Gather",),
                                          quant_axes=(("Gather", 1),))
    quantizer = MatMulNBitsQuantizer(m, algo_config=config)
    quantizer.process()
    quantized = quantizer.model.model.SerializeToString()
    if b"GatherBlockQuantized" not in quantized:
        pytest.skip("this onnxruntime's quantizer left the Gather float")
    indices = np.array([[1, 49, 7], [0, 0, 25]], np.int64)
    import onnxruntime as ort
    want = ort.InferenceSession(quantized, providers=["CPUExecutionProvider"]).run(None, {"idx": indices})[0]
    got = run(quantized, indices)
    np.testing.assert_array_equal(got, want)
    assert np.abs(got - table[indices]).max() < 0.1 * np.abs(table).max()
