"""The cpu backend's Tile as one strided copy and the elementwise ops of the ONNX reference library run in chunks on
the pool's threads (Note [Elementwise reference ops in chunks], cpu_onnx_ops.cpp): Tile against numpy.tile at odd
shapes and dtypes, empty repeats included; the chunked ops give the bits of the one-thread run (which is the
reference's kernel on the whole tensor) on tensors of several chunks with a partial last one."""
import numpy as np
import pytest

import xpuruntime as xrt


@pytest.mark.parametrize("shape,repeats", [((64, 1, 512), [1, 64, 1]), ((3, 5), [2, 3]), ((2, 3, 4), [1, 1, 1]),
                                           ((7,), [5]), ((2, 0, 3), [2, 2, 2]), ((1, 1), [0, 3]),
                                           ((2, 3, 1, 5), [3, 1, 4, 2])])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_tile_matches_numpy(shape, repeats, dtype):
    x = (np.random.default_rng(0).standard_normal(shape) * 10).astype(dtype)
    (y,) = xrt.ops.call("tile", [x], {"repeats": repeats})
    want = np.tile(x, repeats)
    y = np.asarray(y)
    assert y.dtype == want.dtype and np.array_equal(y, want)


@pytest.mark.parametrize("op,attrs", [("elu", {"alpha": 0.7}), ("softplus", {}), ("mish", {}), ("selu", {}),
                                      ("celu", {"alpha": 1.5}), ("sin", {}), ("atan", {}), ("is_nan", {}),
                                      ("round", {}), ("leaky_relu", {"alpha": 0.1})])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_chunked_elementwise_reference_ops_give_the_one_thread_bits(op, attrs, dtype):
    x = (np.random.default_rng(1).standard_normal((3, 70001)) * 3).astype(dtype)  # 210,003 elements: 4 chunks
    x[0, :5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    one = np.asarray(xrt.ops.call(op, [x], attrs, exec_policy=xrt.ExecutionPolicy(intra_op_threads=1))[0])
    two = np.asarray(xrt.ops.call(op, [x], attrs, exec_policy=xrt.ExecutionPolicy(intra_op_threads=2))[0])
    assert one.dtype == two.dtype and one.shape == x.shape
    assert np.array_equal(one.view(np.uint8), two.view(np.uint8))


def _gather_elements_reference(x, indices, axis):
    axis = axis % x.ndim
    coords = list(np.indices(indices.shape))
    coords[axis] = np.where(indices < 0, indices + x.shape[axis], indices)
    return x[tuple(coords)]


@pytest.mark.parametrize("shape,index_shape,axis", [((256, 1024), (256, 1024), 1), ((5, 7, 3), (2, 9, 3), 1),
                                                    ((4, 6), (4, 6), 0), ((3,), (5,), 0), ((2, 3, 4), (2, 3, 2), -1),
                                                    ((7, 1, 5), (7, 1, 5), 2), ((6, 5), (0, 5), 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_, np.int8])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_gather_elements_rows_on_the_threads(shape, index_shape, axis, dtype, index_dtype):
    """gather_elements_fast (cpu_data.cpp): negative indices, indices smaller than the data on other axes, every
    element size, on one and two threads; an index out of range is the reference's typed error."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    n = shape[axis]
    indices = rng.integers(-n, n, size=index_shape).astype(index_dtype)
    want = _gather_elements_reference(x, indices, axis)
    for threads in (1, 2):
        (y,) = xrt.ops.call("gather_elements", [x, indices], {"axis": axis},
                            exec_policy=xrt.ExecutionPolicy(intra_op_threads=threads))
        y = np.asarray(y)
        assert y.dtype == x.dtype and np.array_equal(y, want)


def test_gather_elements_index_out_of_range_is_a_typed_error():
    with pytest.raises(xrt.InvalidArgumentError, match="out of range"):
        xrt.ops.call("gather_elements", [np.zeros((3, 4), np.float32), np.full((3, 4), 7, np.int64)], {"axis": 1})
