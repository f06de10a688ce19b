import threading

import pytest

import xpuruntime as xrt
from conftest import requires_gpu

MiB = 1 << 20
rt = xrt.runtime


def test_simulated_allocator_caches_splits_and_reports_stats():
    a = rt.CachingAllocator.simulated(256 * MiB)
    p = a.allocate(1000)
    q = a.allocate(1000)
    assert q - p == 1024
    s = a.stats()
    assert s["allocation.current"] == 2 and s["segment.current"] == 1
    assert s["reserved_bytes.current"] == 2 * MiB
    assert s["requested_bytes.current"] == 2000
    a.free(p)
    assert a.allocate(900) == p  # cached block reused on the same stream
    a.free(p)
    a.free(q)
    snap = a.snapshot()
    assert len(snap) == 1 and len(snap[0]["blocks"]) == 1 and snap[0]["blocks"][0]["state"] == "inactive"
    a.empty_cache()
    assert a.backing_reserved == 0
    assert a.stats()["num_device_free"] == 1


def test_simulated_allocator_cross_stream_free_waits_for_events():
    a = rt.CachingAllocator.simulated(256 * MiB)
    p = a.allocate(4096, stream=1)
    a.record_stream(p, 2)
    a.free(p)
    assert a.allocate(4096, stream=1) != p
    a.complete_stream(2)
    assert a.allocate(4096, stream=1) == p


def test_double_free_negative_and_absurd_sizes_are_typed_errors():
    a = rt.CachingAllocator.simulated(64 * MiB)
    p = a.allocate(10)
    a.free(p)
    with pytest.raises(xrt.InvalidArgumentError, match="freed twice"):
        a.free(p)
    with pytest.raises(ValueError, match="non-negative"):
        a.allocate(-5)
    with pytest.raises(xrt.OutOfMemoryError, match="tried to allocate 1.00 TiB"):
        a.allocate(1 << 40)
    with pytest.raises(ValueError, match="absurd"):
        rt.allocate(1 << 62, device="cpu")
    with pytest.raises(ValueError, match="non-negative"):
        rt.allocate(-1, device="cpu")
    assert a.stats()["num_ooms"] == 1


def test_oom_message_and_memory_limit():
    a = rt.CachingAllocator.simulated(64 * MiB)
    a.set_memory_limit(32 * MiB)
    keep = a.allocate(20 * MiB)
    with pytest.raises(xrt.OutOfMemoryError) as info:
        a.allocate(16 * MiB)
    message = str(info.value)
    for fragment in ("tried to allocate 16.00 MiB", "20.00 MiB allocated", "reserved", "free of 64.00 MiB",
                     "memory limit 32.00 MiB"):
        assert fragment in message
    assert a.owns(keep)


def test_private_pool_from_python():
    a = rt.CachingAllocator.simulated(64 * MiB)
    pool = a.create_pool()
    a.begin_allocate_to_pool(pool, 7)
    p = a.allocate(4096, stream=7)
    a.free(p)
    a.end_allocate_to_pool(pool)
    assert a.allocate(4096, stream=7) != p
    assert any(seg["pool"] == pool for seg in a.snapshot())
    a.release_pool(pool)
    assert not any(seg["pool"] == pool for seg in a.snapshot())


def test_cpu_buffers_stats_and_limits():
    before = rt.memory_stats("cpu")["allocation.current"]
    with rt.allocate(1000, device="cpu") as buf:
        assert buf.nbytes == 1000 and buf.ptr % 64 == 0 and buf.device == "cpu"
        assert rt.memory_stats("cpu")["allocation.current"] == before + 1
        assert "1000 bytes on cpu" in repr(buf)
    assert rt.memory_stats("cpu")["allocation.current"] == before
    buf.free()  # freeing twice through the owner is harmless
    rt.set_memory_limit(MiB, "cpu")
    try:
        with pytest.raises(xrt.OutOfMemoryError, match="memory limit"):
            rt.allocate(2 * MiB, device="cpu")
        assert rt.get_memory_limit("cpu") == MiB
    finally:
        rt.set_memory_limit(0, "cpu")
    assert rt.memory_allocated("cpu") >= 0


def test_cuda_memory_without_gpu_is_a_cuda_error():
    if xrt.get_device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(xrt.CudaError, match="no CUDA device is available"):
        rt.allocate(16, device="cuda:0")
    with pytest.raises(xrt.CudaError, match="Pinned host memory"):
        rt.allocate(16, pinned=True)
    with pytest.raises(xrt.CudaError):
        rt.memory_stats("cuda:0")


def test_allocator_releases_the_gil_and_is_thread_safe():
    a = rt.CachingAllocator.simulated(256 * MiB)
    errors = []

    def work(stream):
        try:
            for i in range(2000):
                a.free(a.allocate(512 * (1 + i % 5), stream=stream))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert a.stats()["allocation.allocated"] == 8000


@requires_gpu
def test_gpu_allocator_stats_cache_and_oom():
    dev = "cuda:0"
    rt.empty_cache(dev)
    rt.reset_peak_memory_stats(dev)
    base = rt.memory_allocated(dev)
    buf = rt.allocate(3 * MiB, device=dev)
    ptr = buf.ptr
    assert rt.memory_allocated(dev) == base + 3 * MiB
    del buf
    assert rt.memory_allocated(dev) == base
    assert rt.memory_reserved(dev) >= 3 * MiB
    again = rt.allocate(3 * MiB, device=dev)
    assert again.ptr == ptr
    total = xrt.Device(dev).total_memory
    with pytest.raises(xrt.OutOfMemoryError, match="tried to allocate"):
        rt.allocate(2 * total, device=dev)
    assert rt.memory_stats(dev)["num_ooms"] >= 1
    snap = rt.memory_snapshot(dev)
    assert any(b["state"] == "active_allocated" for s in snap for b in s["blocks"])
    again.free()
    rt.empty_cache(dev)
    assert rt.memory_reserved(dev) <= rt.max_memory_reserved(dev)


@requires_gpu
def test_gpu_cross_stream_buffer_free():
    s1 = rt.Stream("cuda:0")
    s2 = rt.Stream("cuda:0")
    buf = rt.allocate(MiB, device="cuda:0", stream=s1)
    buf.record_stream(s2)
    buf.free()
    s2.synchronize()
    # After s2 is idle, the block can be reused on s1.
    nxt = rt.allocate(MiB, device="cuda:0", stream=s1)
    assert nxt.nbytes == MiB


@requires_gpu
def test_pinned_buffers():
    with rt.allocate(MiB, pinned=True) as buf:
        assert buf.pinned and buf.device == "cpu"
    assert rt.pinned_memory_stats()["allocation.allocated"] >= 1
