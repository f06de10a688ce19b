import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

rt = xrt.runtime


def test_cpu_streams_and_missing_gpu_errors():
    s = rt.current_stream("cpu")
    assert s.is_default and s.device == "cpu" and s.query()
    s.synchronize()
    if xrt.get_device_count() == 0:
        with pytest.raises(xrt.CudaError, match="cuda:0"):
            rt.Stream("cuda:0")
        with pytest.raises(xrt.CudaError):
            rt.Event("cuda:0")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        rt.Stream("cpu")
    g = rt.CudaGraph()
    assert not g.is_instantiated
    with pytest.raises(ValueError, match="not been captured"):
        g.replay()


@requires_gpu
def test_streams_priorities_events_timing():
    least, greatest = rt.stream_priority_range("cuda:0")
    hi = rt.Stream("cuda:0", priority=greatest)
    assert hi.priority == greatest
    lo = rt.Stream("cuda:0")
    assert rt.current_stream("cuda:0").is_default
    with hi:
        assert rt.current_stream("cuda:0") == hi
        with lo:
            assert rt.current_stream("cuda:0") == lo
        assert rt.current_stream("cuda:0") == hi
    assert rt.current_stream("cuda:0").is_default
    start = rt.Event("cuda:0", enable_timing=True)
    end = rt.Event("cuda:0", enable_timing=True)
    start.record(hi)
    x = xrt.zeros((1 << 24,), device="cuda:0", stream=hi)
    end.record(hi)
    lo.wait_event(end)
    end.synchronize()
    assert start.elapsed_time(end) > 0
    assert end.query()
    ev = lo.record_event()
    ev.synchronize()
    del x


@requires_gpu
def test_graph_capture_with_private_pool_and_replay():
    g = rt.CudaGraph()
    src = xrt.tensor(np.arange(256, dtype=np.float32), device="cuda:0")
    s = rt.Stream("cuda:0")
    with rt.graph(g, stream=s):
        tmp = xrt.empty((256,), "float32", device="cuda:0")  # from the graph's pool
        tmp.copy_(src, non_blocking=True)
        out = xrt.zeros((256,), "float32", device="cuda:0")
        out.copy_(tmp, non_blocking=True)
    assert g.is_instantiated and g.num_nodes >= 3 and g.pool > 0
    assert any(seg["pool"] == g.pool for seg in rt.memory_snapshot("cuda:0"))
    src.copy_(np.full(256, 5.0, np.float32))
    g.replay()
    s.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), np.full(256, 5.0, np.float32))
    pool = g.pool
    del tmp
    g.reset()
    del out
    rt.empty_cache("cuda:0")
    assert not any(seg["pool"] == pool for seg in rt.memory_snapshot("cuda:0"))
