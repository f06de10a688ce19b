"""xpuruntime.profile / xpuruntime.runtime.profiler: node events of the native engine matching explain(), session
events, user ranges that nest, start/stop and the context manager, nothing recorded when off, allocator events, the
per-node summary and its table, typed errors, and the Chrome trace checked against the structure Perfetto and
chrome://tracing read (every complete event has name/ph/ts/dur/pid/tid, flow events pair up). On a GPU: CUPTI
kernels under their nodes (skipped without one)."""

from __future__ import annotations

import json
import pathlib
import threading

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "models" / "tiny_classifier.onnx"
EVENT_KEYS = {"name", "cat", "ts_us", "dur_us", "pid", "tid", "args", "id", "parent", "device"}
CATEGORIES = {"session", "node", "kernel", "memcpy", "memset", "sync", "alloc", "range"}


@pytest.fixture()
def session() -> xrt.InferenceSession:
    return xrt.InferenceSession(MODEL, engine="native")


def feeds(batch: int = 2):
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((batch, 8)).astype(np.float32)}


def of(events, cat):
    return [e for e in events if e["cat"] == cat]


def test_node_events_match_explain(session):
    with xrt.profile(cuda=False) as p:
        session.run(feeds(2))
    events = p.events()
    assert events, "nothing recorded"
    for e in events:
        assert EVENT_KEYS <= set(e), e
        assert e["cat"] in CATEGORIES
        assert e["dur_us"] >= 0
    nodes = of(events, "node")
    explained = session.explain().nodes
    assert [e["name"] for e in nodes] == [n["node"] for n in explained]
    for e, n in zip(nodes, explained):
        args = e["args"]
        assert args["kernel"] == n["kernel"] and args["backend"] == n["backend"] and args["op_type"] == n["op_type"]
        assert args["reason"]
        assert args["precision"] == n["precision"] or n["precision"] == ""
        assert args["bytes"] > 0
        assert isinstance(args["input_shapes"], list) and isinstance(args["output_shapes"], list)
    assert "float32[2,8]" in nodes[0]["args"]["input_shapes"]
    assert nodes[-1]["args"]["output_shapes"] == ["float32[2,4]"] or nodes[-1]["args"]["output_shapes"][0].startswith(
        "float32[2,")
    run = [e for e in of(events, "session") if e["args"].get("engine") == "native"]
    assert len(run) == 1 and run[0]["args"]["input_shapes"] == ["x: float32[2,8]"]
    start, end = run[0]["ts_us"], run[0]["ts_us"] + run[0]["dur_us"]
    assert all(start <= n["ts_us"] and n["ts_us"] + n["dur_us"] <= end + 1e-3 for n in nodes)
    assert p.metadata["cuda_activity"].startswith("off")


def test_record_shapes_false(session):
    with xrt.profile(cuda=False, record_shapes=False) as p:
        session.run(feeds(1))
    for e in of(p.events(), "node"):
        assert "input_shapes" not in e["args"] and "kernel" in e["args"]


def test_ranges_nest(session):
    with xrt.profile(cuda=False) as p:
        with p.range("outer"):
            with p.range("inner"):
                session.run(feeds(1))
    ranges = {e["name"]: e for e in of(p.events(), "range")}
    assert set(ranges) == {"outer", "inner"}
    outer, inner = ranges["outer"], ranges["inner"]
    assert outer["args"]["depth"] == 0 and inner["args"]["depth"] == 1
    assert outer["ts_us"] <= inner["ts_us"]
    assert inner["ts_us"] + inner["dur_us"] <= outer["ts_us"] + outer["dur_us"] + 1e-3
    for n in of(p.events(), "node"):
        assert inner["ts_us"] <= n["ts_us"] and n["ts_us"] + n["dur_us"] <= inner["ts_us"] + inner["dur_us"] + 1e-3


def test_start_stop_and_one_profiler_at_a_time(session):
    p = xrt.profile(cuda=False)
    assert isinstance(p, xrt.Profiler) and not p.recording
    assert "stopped" in repr(p)
    p.stop()  # not recording: nothing happens
    assert p.start() is p
    assert p.recording and xrt.runtime.is_profiling()
    with pytest.raises(xrt.InvalidArgumentError, match="already recording"):
        p.start()
    other = xrt.Profiler(cuda=False)
    with pytest.raises(xrt.InvalidArgumentError, match="another profiler"):
        other.start()
    session.run(feeds(1))
    assert of(p.events(), "node")  # readable while recording
    assert "recording" in repr(p)
    p.stop()
    assert not xrt.runtime.is_profiling()
    count = len(p.events())
    session.run(feeds(1))  # off: nothing more
    assert len(p.events()) == count
    with other:
        session.run(feeds(1))
    assert of(other.events(), "node")
    p.start()
    assert p.events() == []
    p.stop()


def test_profiling_off_records_nothing(session):
    p = xrt.Profiler(cuda=False)
    session.run(feeds(3))
    with p.range("not recording"):
        session.run(feeds(3))
    assert p.events() == [] and p.summary() == []
    assert p.memory["allocations"] == 0


def test_allocator_events(session):
    with xrt.profile(cuda=False) as p:
        session.run(feeds(4))
        buf = xrt.empty((1024,), "float32")
        del buf
    mem = p.memory
    assert mem["allocations"] >= 1 and mem["frees"] >= 1
    assert "cpu" in mem["devices"]
    cpu = mem["devices"]["cpu"]
    assert cpu["allocated_bytes"] >= 4096 and cpu["peak_bytes"] > 0
    assert mem["peak_bytes"] >= cpu["peak_bytes"]
    for e in of(p.events(), "alloc"):
        assert e["name"] in ("allocate", "free") and e["args"]["bytes"] > 0 and "allocated_bytes" in e["args"]


def test_summary_and_table(session):
    session.run(feeds(4))
    with xrt.profile(cuda=False) as p:
        for _ in range(3):
            session.run(feeds(4))
    rows = p.summary()
    explained = session.explain().nodes
    assert len(rows) == len(explained)
    keys = {"node", "op_type", "kernel", "backend", "precision", "calls", "total_us", "mean_us", "share", "bytes"}
    for row in rows:
        assert keys <= set(row)
        assert row["calls"] == 3
        assert row["mean_us"] == pytest.approx(row["total_us"] / 3)
    assert [r["total_us"] for r in rows] == sorted((r["total_us"] for r in rows), reverse=True)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    table = p.summary_table()
    assert "total_us" in table and all(n["node"] in table for n in explained)
    with pytest.raises(xrt.InvalidArgumentError):
        p.summary_table(-1)


def validate_chrome_trace(trace: dict) -> None:
    """The structure chrome://tracing and Perfetto read (the Trace Event Format), checked key by key."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit", "metadata"}
    assert trace["displayTimeUnit"] in ("ms", "ns")
    assert isinstance(trace["metadata"], dict)
    number = (int, float)
    flows = {}
    for e in trace["traceEvents"]:
        assert isinstance(e, dict) and isinstance(e.get("ph"), str), e
        assert isinstance(e.get("pid"), int), e
        ph = e["ph"]
        if ph == "X":
            for key, kind in (("name", str), ("cat", str), ("ts", number), ("dur", number), ("pid", int),
                              ("tid", int), ("args", dict)):
                assert isinstance(e.get(key), kind), f"{key} in {e}"
            assert e["dur"] >= 0
        elif ph == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
            assert isinstance(e["args"], dict)
        elif ph in ("s", "f"):
            assert isinstance(e["id"], int) and isinstance(e["ts"], number) and isinstance(e["tid"], int)
            flows.setdefault(e["id"], []).append(ph)
            if ph == "f":
                assert e.get("bp") == "e"
        elif ph == "i":
            assert e.get("s") in ("t", "p", "g") and isinstance(e["ts"], number)
        elif ph == "C":
            assert isinstance(e["args"], dict) and all(isinstance(v, number) for v in e["args"].values())
        else:
            raise AssertionError(f"unexpected phase {ph!r}: {e}")
    for fid, phases in flows.items():
        assert sorted(phases) == ["f", "s"], f"flow {fid}: {phases}"


def test_chrome_trace_export(session, tmp_path):
    with xrt.profile(cuda=False) as p:
        with p.range("step 1"):
            session.run(feeds(2))
        buf = xrt.empty((256,), "float32")
        del buf
    path = p.export_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(pathlib.Path(path).read_text())
    validate_chrome_trace(trace)
    assert trace == p.chrome_trace()
    cats = {e.get("cat") for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"node", "session", "range"} <= cats
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert "xpuruntime (host)" in names
    node = next(e for e in trace["traceEvents"] if e.get("cat") == "node")
    assert {"node", "op_type", "kernel", "backend", "precision", "reason", "input_shapes"} <= set(node["args"])
    assert any(e["ph"] == "C" for e in trace["traceEvents"])
    with pytest.raises(xrt.InvalidArgumentError, match="cannot write"):
        p.export_chrome_trace(tmp_path / "missing-folder" / "trace.json")
    with pytest.raises(xrt.InvalidTypeError):
        p.export_chrome_trace(42)


def test_bad_arguments_are_typed():
    with pytest.raises(xrt.InvalidTypeError):
        xrt.profile(cuda="yes")
    p = xrt.profile(cuda=False)
    with pytest.raises(xrt.InvalidTypeError):
        p.range(3)


@pytest.mark.skipif(xrt.get_device_count() > 0, reason="this machine has a GPU")
def test_cuda_true_without_a_gpu_says_why():
    p = xrt.profile(cuda=True)
    with pytest.raises(xrt.UnsupportedOperationError, match="CUDA activity"):
        p.start()
    assert not p.recording
    with xrt.profile() as auto:  # cuda=None: host events, and the reason
        pass
    assert not auto.cuda_activity and auto.cuda_activity_reason


def test_events_from_several_threads(session):
    with xrt.profile(cuda=False) as p:
        threads = [threading.Thread(target=lambda: session.run(feeds(2))) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    runs = [e for e in of(p.events(), "session") if e["args"].get("engine") == "native"]
    assert len(runs) == 3
    assert len(of(p.events(), "node")) == 3 * len(session.explain().nodes)


@requires_gpu
def test_cupti_kernels_under_their_nodes(tmp_path):
    sess = xrt.InferenceSession(MODEL, device="cuda:0", engine="native")
    sess.run(feeds(8))
    sess.run(feeds(8))  # captured into a CUDA graph
    p = xrt.profile()
    p.start()
    if not p.cuda_activity:
        reason = p.cuda_activity_reason
        p.stop()
        pytest.skip(f"no CUDA activity: {reason}")
    sess.run(feeds(8))
    p.stop()
    events = p.events()
    nodes = {e["id"]: e for e in of(events, "node")}
    kernels = of(events, "kernel")
    assert kernels and all(k["device"] for k in kernels)
    attributed = [k for k in kernels if k["parent"] is not None]
    assert attributed and all(k["parent"] in nodes for k in attributed)
    assert any(r["device_kernels"] for r in p.summary())
    assert "cuda_graphs" in p.metadata
    trace = p.chrome_trace()
    validate_chrome_trace(trace)
    assert any(e["ph"] == "s" for e in trace["traceEvents"])
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert "cuda:0" in names
