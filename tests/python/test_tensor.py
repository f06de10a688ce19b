import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu, requires_torch_gpu

DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "bool"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (7, 13), (3, 1, 5), (2, 3, 4, 5)])
def test_numpy_round_trip_is_zero_copy(dtype, shape):
    rng = np.random.default_rng(0)
    a = np.asarray(rng.standard_normal(shape) * 10).astype(dtype)
    t = xrt.from_dlpack(a)
    assert t.shape == a.shape and t.dtype == dtype and t.device == "cpu"
    if dtype != "bool" or np.lib.NumpyVersion(np.__version__) >= "1.25.0":  # numpy < 1.25 has no DLPack bool
        b = np.from_dlpack(t)
        assert np.shares_memory(a, b) or a.size == 0
        np.testing.assert_array_equal(b, a)
    np.testing.assert_array_equal(t.to_numpy(), a)


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_unsigned_values_above_the_signed_range_round_trip(dtype):
    info = np.iinfo(dtype)
    a = np.array([0, 1, info.max // 2 + 1, info.max - 1, info.max], dtype=dtype)
    t = xrt.from_numpy(a)
    assert t.dtype == dtype and t.itemsize == a.itemsize
    np.testing.assert_array_equal(t.numpy(), a)
    assert t.numpy().dtype == np.dtype(dtype)
    copy = xrt.tensor(a)  # a copy through empty() + copy_()
    assert copy.dtype == dtype and copy.data_ptr != t.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(copy), a)
    assert xrt.zeros(3, dtype).dtype == dtype and xrt.empty(2, getattr(np, dtype)).dtype == dtype


def test_view_reinterprets_bits_of_one_element_size():
    # bfloat16 bit patterns: 1.0, -2.0, 3.0 and a NaN.
    bits = np.array([[0x3F80, 0xC000], [0x4040, 0x7FC0]], dtype=np.uint16)
    t = xrt.from_numpy(bits)
    bf16 = t.view("bfloat16")
    assert (bf16.dtype, bf16.shape, bf16.strides, bf16.data_ptr) == ("bfloat16", (2, 2), (2, 1), t.data_ptr)
    assert "dtype=bfloat16" in repr(bf16)
    back = bf16.view(np.uint16).numpy()
    assert np.shares_memory(back, bits)
    bits[0, 0] = 0x4000  # the memory is shared: 2.0 shows through the view
    as_float = xrt.ops.cast(bf16, "float32").numpy()
    np.testing.assert_array_equal(as_float[:, :1], [[2.0], [3.0]])
    assert as_float[0, 1] == -2.0 and np.isnan(as_float[1, 1])
    # Other pairs of one size, and strided views.
    f = np.array([1.0, -0.0], dtype=np.float32)
    np.testing.assert_array_equal(xrt.from_numpy(f).view("uint32").numpy(), [0x3F800000, 0x80000000])
    strided = xrt.from_numpy(np.arange(6, dtype=np.int64)[::2]).view("uint64")
    assert strided.strides == (2,)
    np.testing.assert_array_equal(strided.numpy(), [0, 2, 4])


def test_view_and_bfloat16_errors_say_what_to_do():
    t = xrt.zeros(4, "uint16")
    with pytest.raises(xrt.InvalidTypeError, match=r"uint16 \(2-byte elements\) as float32 \(4-byte elements\)"):
        t.view("float32")
    with pytest.raises(xrt.InvalidTypeError, match="dtype is required"):
        t.view(None)
    with pytest.raises(xrt.InvalidTypeError, match="Unknown dtype"):
        t.view("uint128")
    with pytest.raises(xrt.InvalidTypeError, match=r't.view\("uint16"\).numpy\(\) gives the bit patterns'):
        t.view("bfloat16").numpy()


def test_strided_and_readonly_numpy_views():
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    view = a.transpose(2, 0, 1)[:, ::2]
    t = xrt.from_numpy(view)
    assert not t.is_contiguous()
    np.testing.assert_array_equal(t.to_numpy(), view)
    np.testing.assert_array_equal(t.contiguous().to_numpy(), np.ascontiguousarray(view))
    ro = np.arange(6.0)
    ro.flags.writeable = False
    np.testing.assert_array_equal(xrt.from_dlpack(ro).to_numpy(), ro)
    neg = a[::-1]
    np.testing.assert_array_equal(xrt.from_numpy(neg).contiguous().to_numpy(), neg)


def test_memory_stays_alive_while_views_exist():
    t = xrt.tensor(np.arange(10, dtype=np.int64))
    arr = t.to_numpy()
    del t
    np.testing.assert_array_equal(arr, np.arange(10))
    a = np.ones(5)
    t2 = xrt.from_dlpack(a)
    del a
    assert t2.to_numpy().sum() == 5


def test_factories_and_copies():
    z = xrt.zeros((2, 3), "int32")
    assert z.to_numpy().tolist() == [[0, 0, 0], [0, 0, 0]]
    e = xrt.empty([4], dtype="float16")
    e.copy_(np.full(4, 2.5, np.float16))
    np.testing.assert_array_equal(e.to_numpy(), np.full(4, 2.5, np.float16))
    t = xrt.tensor([[1, 2], [3, 4]], dtype="float32")
    assert t.dtype == "float32" and t.numel() == 4 and t.nbytes == 16 and len(t) == 2
    assert np.asarray(t).sum() == 10
    assert "shape=[2, 2]" in repr(t)
    assert xrt.empty(3, dtype="bf16").dtype == "bfloat16"


def test_bad_inputs_are_typed_errors():
    with pytest.raises(ValueError, match=r"\[2, -1\]"):
        xrt.empty((2, -1))
    with pytest.raises(TypeError, match="Unknown dtype"):
        xrt.empty((2,), dtype="complex64")
    with pytest.raises(TypeError, match="has no xpuruntime equivalent"):
        xrt.from_numpy(np.zeros(3, np.complex64))
    with pytest.raises(TypeError, match="__dlpack__"):
        xrt.from_dlpack([1, 2, 3])
    t = xrt.zeros((2, 3))
    with pytest.raises(ValueError, match=r"\[3, 2\]"):
        t.copy_(np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="float64"):
        t.copy_(np.zeros((2, 3), np.float64))
    with pytest.raises(TypeError, match="bfloat16"):
        xrt.zeros(3, "bfloat16").to_numpy()
    with pytest.raises(ValueError, match="device"):
        xrt.zeros(3, device="tpu:0")
    with pytest.raises(xrt.UnsupportedOperationError, match="does not run on NPUs yet"):
        xrt.zeros(3, device="npu:0")
    if xrt.get_device_count() == 0:
        with pytest.raises(xrt.CudaError, match="no CUDA device"):
            t.to("cuda:0")


def test_capsules_are_consumed_once():
    t = xrt.tensor(np.arange(4.0))
    capsule = t.__dlpack__()
    u = xrt.from_dlpack(capsule)
    assert u.data_ptr == t.data_ptr
    with pytest.raises(TypeError, match="consumed only once"):
        xrt.from_dlpack(capsule)
    versioned = t.__dlpack__(max_version=(1, 0))
    assert xrt.from_dlpack(versioned).data_ptr == t.data_ptr
    assert t.__dlpack_device__() == (1, 0)
    copied = xrt.from_dlpack(t.__dlpack__(copy=True))
    assert copied.data_ptr != t.data_ptr
    np.testing.assert_array_equal(copied.to_numpy(), t.to_numpy())
    unused = t.__dlpack__()
    del unused  # an unconsumed capsule frees its tensor


@requires_gpu
@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 1, 129), (2, 3, 5, 7)])
def test_gpu_round_trips(shape):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(shape).astype(np.float32)
    g = xrt.tensor(a, device="cuda:0")
    assert g.device == "cuda:0" and g.__dlpack_device__() == (2, 0)
    np.testing.assert_array_equal(g.to_numpy(), a)
    np.testing.assert_array_equal(g.cpu().to_numpy(), a)
    at = a.T
    gt = xrt.from_numpy(at).to("cuda:0")
    np.testing.assert_array_equal(gt.to_numpy(), at)
    s = xrt.runtime.Stream("cuda:0")
    h = g.to("cpu", stream=s, non_blocking=False)
    np.testing.assert_array_equal(h.to_numpy(), a)
    np.testing.assert_array_equal(np.from_dlpack(g, device="cpu") if np.lib.NumpyVersion(np.__version__) >= "2.1.0"
                                  else g.to_numpy(), a)
    z = xrt.zeros(shape, "float32", device="cuda:0")
    assert not z.to_numpy().any()
    z.copy_(g)
    np.testing.assert_array_equal(z.to_numpy(), a)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "uint8"])
def test_gpu_copies_between_layouts_run_on_the_device(dtype):
    a = (np.arange(3 * 4 * 5) % 251).reshape(3, 4, 5).astype(dtype)
    view = a.transpose(2, 0, 1)
    g = xrt.from_numpy(view).to("cuda:0")  # dense: keeps the permuted strides
    assert not g.is_contiguous()
    c = g.contiguous()  # a CUDA -> CUDA copy between layouts: the cuda_raw gather kernel
    assert c.is_contiguous() and c.device == "cuda:0"
    np.testing.assert_array_equal(c.to_numpy(), np.ascontiguousarray(view))
    z = xrt.zeros(view.shape, dtype, device="cuda:0")
    z.copy_(g)
    np.testing.assert_array_equal(z.to_numpy(), view)


@requires_gpu
def test_pinned_tensors():
    p = xrt.empty((1024,), "float32", device="cpu", pinned=True)
    assert p.is_pinned
    p.copy_(np.arange(1024, dtype=np.float32))
    g = p.to("cuda:0")
    np.testing.assert_array_equal(g.to_numpy(), np.arange(1024, dtype=np.float32))


@requires_torch_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int64", "bool"])
def test_torch_round_trips_both_directions(dtype):
    import torch

    import xpuruntime.pytorch as xrt_torch

    tt = torch.randn(33, 17, device="cuda").to(getattr(torch, dtype))
    x = xrt.from_dlpack(tt)  # torch -> xpuruntime, zero-copy
    assert x.device == "cuda:0" and x.dtype == dtype and x.data_ptr == tt.data_ptr()
    back = torch.from_dlpack(x)  # xpuruntime -> torch, zero-copy
    assert back.data_ptr() == tt.data_ptr()
    assert torch.equal(back, tt)
    mine = xrt.zeros((5, 3), dtype, device="cuda:0")
    tv = xrt_torch.to_torch(mine)
    tv.fill_(1)  # torch writes into xpuruntime memory
    torch.cuda.synchronize()
    assert torch.equal(xrt_torch.to_torch(mine), torch.ones(5, 3, device="cuda", dtype=tt.dtype))
    nc = tt.t()
    x2 = xrt_torch.from_torch(nc)
    assert x2.strides == tuple(nc.stride())
    assert torch.equal(torch.from_dlpack(x2), nc)


@requires_torch_gpu
def test_torch_stream_interop():
    import torch

    import xpuruntime.pytorch as xrt_torch

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        view = xrt_torch.current_stream()
        assert view.handle == s.cuda_stream
        a = torch.full((1 << 20,), 3.0, device="cuda")
        x = xrt.from_dlpack(a)
    with view:
        host = x.to("cpu")
    assert float(host.to_numpy().sum()) == 3.0 * (1 << 20)
