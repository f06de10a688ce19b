"""xpuruntime.profile / xpuruntime.runtime.profiler: node events of the native engine matching explain(), session
events, user ranges that nest, start/stop and the context manager, nothing recorded when off, allocator events, the
per-node summary and its table, typed errors, and the Chrome trace checked against the structure Perfetto and
chrome://tracing read (every complete event has name/ph/ts/dur/pid/tid, flow events pair up). On a GPU: CUPTI
kernels under their nodes (skipped without one). ONNX Runtime: the onnxruntime engine's nodes as node events (its
profile files cleaned up), and merge_ort_profile into a Profiler, a Chrome trace dict and a trace file."""

from __future__ import annotations

import gc
import json
import pathlib
import threading

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu, requires_ort
from xpuruntime.runtime.profiler import merge_ort_profile

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
    assert p.metadata["cuda_graph_replays"].startswith("replayed"), p.metadata
    trace = p.chrome_trace()
    validate_chrome_trace(trace)
    assert any(e["ph"] == "s" for e in trace["traceEvents"])
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert "cuda:0" in names


@requires_gpu
def test_cuda_graph_replays_are_profiled_node_by_node():
    """Note [Graph node attribution]: under a profiler with CUPTI, a captured plan keeps replaying its CUDA graph
    (captured again once, under step labels) and each replay's kernels come back as node events of their steps."""
    graphs = xrt.InferenceSession(MODEL, device="cuda:0", engine="native")
    eager = xrt.InferenceSession(MODEL, device="cuda:0", engine="native",
                                 exec_policy=xrt.ExecutionPolicy(cuda_graphs=False))
    x = feeds(8)
    for _ in range(3):
        graphs.run(x)
        eager.run(x)
    with xrt.profile(cuda=True) as p_eager:
        eager.run(x)
    with xrt.profile(cuda=True) as p:
        for _ in range(3):
            graphs.run(x)
    if not p.metadata.get("cuda_graph_replays", "").startswith("replayed"):
        pytest.skip(f"graph node tracking unavailable: {p.metadata.get('cuda_graph_replays')}")
    events = p.events()
    plan_runs = [e for e in events if e["cat"] == "session" and e["name"] == "plan run"]
    assert len(plan_runs) == 3
    assert all(e["args"]["cuda_graph"] == "replayed; nodes from CUPTI graph node ids" for e in plan_runs)
    nodes = {e["id"]: e for e in of(events, "node")}
    kernels = of(events, "kernel")
    assert kernels and all(k["parent"] in nodes for k in kernels), "every replayed kernel belongs to a node"
    launches = {}
    for n in nodes.values():
        assert n["args"]["timing"].startswith("device time")
        assert n["dur_us"] > 0 and n["args"]["kernel"] and n["args"]["backend"]
        launches.setdefault(n["args"]["graph_launch"], set()).add(n["name"])
    assert len(launches) == 3, "one set of node events per replay"
    eager_nodes = {e["name"] for e in of(p_eager.events(), "node") if e["args"].get("device_kernels")}
    for names in launches.values():
        assert names == eager_nodes, (sorted(names ^ eager_nodes))
    # The same kernels per replay as the eager run launched.
    eager_kernels = sorted(k["name"] for k in of(p_eager.events(), "kernel"))
    per_launch = {}
    for k in kernels:
        per_launch.setdefault(nodes[k["parent"]]["args"]["graph_launch"], []).append(k["name"])
    assert all(sorted(v) == eager_kernels for v in per_launch.values())
    summary = {r["node"]: r for r in p.summary()}
    assert eager_nodes <= set(summary)
    validate_chrome_trace(p.chrome_trace())


# ---------------------------------------------------------------------------------------------------------------
# ONNX Runtime: the onnxruntime engine's nodes, and merging a profile ORT wrote (docs/profiling.md)
# ---------------------------------------------------------------------------------------------------------------


# A run-level profile as ONNX Runtime 1.29 writes it (args trimmed), one run of two nodes, and an event of a kind
# that is left out.
ORT_PROFILE = [
    {"cat": "Session", "pid": 7, "tid": 8, "dur": 128, "ts": 0, "ph": "X", "name": "model_run", "args": {}},
    {"cat": "Node", "pid": 7, "tid": 8, "dur": 83, "ts": 12, "ph": "X", "name": "gemm0_kernel_time",
     "args": {"op_name": "Gemm", "provider": "CPUExecutionProvider", "node_index": "0", "activation_size": "32",
              "parameter_size": "64", "output_size": "16", "input_type_shape": [{"float": [2, 4]}],
              "output_type_shape": [{"float": [2, 2]}]}},
    {"cat": "Node", "pid": 7, "tid": 8, "dur": 11, "ts": 100, "ph": "X", "name": "relu0_kernel_time",
     "args": {"op_name": "Relu", "provider": "CPUExecutionProvider", "node_index": "1",
              "input_type_shape": [{"float": [2, 2]}], "output_type_shape": [{"float": [2, 2]}]}},
    {"cat": "Api", "pid": 7, "tid": 8, "dur": 1, "ts": 5, "ph": "X", "name": "cudaLaunchKernel", "args": {}},
]




@pytest.fixture()
def ort_profile_file(tmp_path) -> pathlib.Path:
    path = tmp_path / "ort_profile.json"
    path.write_text(json.dumps(ORT_PROFILE))
    return path


@requires_ort
def test_onnxruntime_nodes_are_node_events():
    sess = xrt.InferenceSession(MODEL, engine="onnxruntime")
    sess.run(feeds(2))  # the first run takes explain()'s profile
    explained = sess.explain().nodes
    assert explained
    with xrt.profile(cuda=False) as p:
        sess.run(feeds(2))
        sess.run(feeds(3))
    events = p.events()
    nodes = of(events, "node")
    assert [e["name"] for e in nodes] == [n["node"] for n in explained] * 2
    for e, n in zip(nodes, explained * 2):
        args = e["args"]
        assert args["backend"] == "CPUExecutionProvider" and args["kernel"] == n["kernel"]
        assert args["op_type"] == n["op_type"] and args["engine"] == "onnxruntime"
        assert args["precision"] and args["reason"]
        assert isinstance(args["input_shapes"], list) and isinstance(args["output_shapes"], list)
    assert "float32[3,8]" in nodes[len(explained)]["args"]["input_shapes"]
    runs = [e for e in of(events, "session") if e["name"] == "session run (onnxruntime)"]
    ort_runs = [e for e in of(events, "session") if e["name"] == "onnxruntime run"]
    assert len(runs) == 2 and len(ort_runs) == 2
    for k, run in enumerate(runs):
        inside = nodes[k * len(explained):(k + 1) * len(explained)]
        assert all(run["ts_us"] <= n["ts_us"] and n["ts_us"] + n["dur_us"] <= run["ts_us"] + run["dur_us"] + 1e-3
                   for n in inside)
        assert run["ts_us"] <= ort_runs[k]["ts_us"]
    rows = p.summary()
    assert {r["node"] for r in rows} == {n["node"] for n in explained}
    assert all(r["calls"] == 2 and r["backend"] == "CPUExecutionProvider" for r in rows)
    assert "CPUExecutionProvider" in p.summary_table()
    trace = p.chrome_trace()
    validate_chrome_trace(trace)
    assert sum(1 for e in trace["traceEvents"] if e.get("cat") == "node") == len(nodes)


@requires_ort
def test_onnxruntime_profiles_leave_no_files(tmp_path, monkeypatch):
    # ORT writes its profiles under TMPDIR, in a folder per session: each file is read and removed, the folder goes
    # with the session.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    sess = xrt.InferenceSession(MODEL, engine="onnxruntime")
    for _ in range(3):
        sess.run(feeds(1))  # the first one profiled for explain(), the others not at all
    with xrt.profile(cuda=False) as p:
        sess.run(feeds(1))
    assert len(of(p.events(), "node")) == len(sess.explain().nodes)
    assert not list(tmp_path.rglob("*.json"))
    del sess
    gc.collect()
    assert not list(tmp_path.iterdir())


def test_merge_ort_profile_into_a_profiler(ort_profile_file):
    with xrt.profile(cuda=False) as p:
        pass
    with pytest.raises(xrt.InvalidArgumentError, match="offset_us"):
        merge_ort_profile(p, ort_profile_file)  # no onnxruntime session run to pair model_run with
    added = merge_ort_profile(p, ort_profile_file, offset_us=100)
    assert added["node_events"] == 2 and added["session_events"] == 1 and added["skipped"] == 1
    assert "offset_us" in added["alignment"]
    nodes = of(p.events(), "node")
    assert [n["name"] for n in nodes] == ["gemm0", "relu0"]
    assert nodes[0]["ts_us"] == pytest.approx(112.0) and nodes[0]["dur_us"] == pytest.approx(83.0)
    assert nodes[0]["args"]["input_shapes"] == ["float32[2,4]"] and nodes[0]["args"]["bytes"] == 112
    rows = p.summary()
    assert [r["node"] for r in rows] == ["gemm0", "relu0"]
    assert rows[0]["backend"] == "CPUExecutionProvider" and rows[0]["op_type"] == "Gemm"
    assert str(ort_profile_file) in p.metadata["ort_profiles_merged"]
    validate_chrome_trace(p.chrome_trace())
    # By ORT's profiling start on the system clock (onnxruntime's get_profiling_start_time_ns()).
    with xrt.profile(cuda=False) as q:
        pass
    start = int(q.metadata["start_time_unix_ns"])
    q.merge_ort_profile(ort_profile_file, start_time_ns=start + 2_000_000)
    assert of(q.events(), "node")[0]["ts_us"] == pytest.approx(2012.0)


def test_merge_ort_profile_into_a_chrome_trace(ort_profile_file, tmp_path):
    with xrt.profile(cuda=False) as p:
        with p.range("step"):
            pass
    trace = p.chrome_trace()
    added = merge_ort_profile(trace, ort_profile_file, offset_us=5.0)  # a dict: updated in place
    assert added["node_events"] == 2
    validate_chrome_trace(trace)
    nodes = [e for e in trace["traceEvents"] if e.get("cat") == "node"]
    assert [e["name"] for e in nodes] == ["gemm0", "relu0"] and nodes[0]["ts"] == pytest.approx(17.0)
    assert any(e.get("cat") == "range" for e in trace["traceEvents"])
    # A trace file: rewritten, or written to `output`.
    path = p.export_chrome_trace(tmp_path / "trace.json")
    merged = tmp_path / "merged.json"
    merge_ort_profile(path, ort_profile_file, offset_us=5.0, output=merged)
    assert not any(e.get("cat") == "node" for e in json.loads(pathlib.Path(path).read_text())["traceEvents"])
    assert sum(1 for e in json.loads(merged.read_text())["traceEvents"] if e.get("cat") == "node") == 2
    merge_ort_profile(path, ort_profile_file, offset_us=5.0)
    validate_chrome_trace(json.loads(pathlib.Path(path).read_text()))


def test_merge_ort_profile_errors_are_typed(ort_profile_file, tmp_path):
    p = xrt.profile(cuda=False)
    p.start()
    with pytest.raises(xrt.InvalidArgumentError, match="stop"):
        merge_ort_profile(p, ort_profile_file, offset_us=0)
    p.stop()
    with pytest.raises(xrt.InvalidArgumentError, match="cannot read"):
        merge_ort_profile(p, tmp_path / "missing.json", offset_us=0)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(xrt.InvalidArgumentError, match="JSON"):
        merge_ort_profile(p, bad, offset_us=0)
    with pytest.raises(xrt.InvalidTypeError):
        merge_ort_profile(p, ort_profile_file, offset_us="5")
    with pytest.raises(xrt.InvalidTypeError):
        merge_ort_profile(p, ort_profile_file, start_time_ns=1.5)
    with pytest.raises(xrt.InvalidTypeError):
        merge_ort_profile(42, ort_profile_file)
    with pytest.raises(xrt.InvalidArgumentError, match="traceEvents"):
        merge_ort_profile({"a": 1}, ort_profile_file, offset_us=0)
    with pytest.raises(xrt.InvalidArgumentError, match="output"):
        merge_ort_profile(p, ort_profile_file, offset_us=0, output=tmp_path / "x.json")
