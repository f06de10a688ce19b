"""ExecutionPolicy.memory_limit bounds what a run allocates on every engine (docs/reliability.md, "Out of memory"):
the issue-39 reproduction, a Loop stacking 1 MiB rows 2000 times under a 16 MiB limit, which under engine "auto" on
the CPU (the onnxruntime engine) grew the process by 1.9 GiB with no error (Note [memory_limit through ORT])."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import xpuruntime as xrt
from conftest import requires_ort

ROW = 262144  # float32: 1 MiB


def rows_loop_model() -> bytes:
    """acc, rows = Loop(trips) with acc starting at x: acc += x each iteration, each new acc a scan output row (1 MiB)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
         helper.make_node("Add", ["acc_in", "x"], ["acc_out"], name="accumulate"),
         helper.make_node("Identity", ["acc_out"], ["row_out"], name="row")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [ROW])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [ROW]),
         helper.make_tensor_value_info("row_out", TensorProto.FLOAT, [ROW])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["acc", "rows"], body=body, name="grow")],
        "rows_loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROW]),
         helper.make_tensor_value_info("trips", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("acc", TensorProto.FLOAT, [ROW]),
         helper.make_tensor_value_info("rows", TensorProto.FLOAT, [None, ROW])],
        [helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _rss_mib() -> int:
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) // 1024


@pytest.mark.parametrize("engine", ["native", pytest.param("onnxruntime", marks=requires_ort),
                                    pytest.param("auto", marks=requires_ort)])
def test_memory_limit_bounds_a_loop_that_stacks_rows(engine):
    session = xrt.InferenceSession(rows_loop_model(), engine=engine,
                                   exec_policy=xrt.ExecutionPolicy(memory_limit="16MiB"))
    x = np.ones(ROW, np.float32)
    np.testing.assert_array_equal(session.run({"x": x, "trips": np.array(2, np.int64)})["rows"][:, 0], [2.0, 3.0])
    before = _rss_mib()
    for _ in range(2):
        with pytest.raises(xrt.OutOfMemoryError, match=r"node 'grow' \(Loop.*memory_limit = 16\.00 MiB"):
            session.run({"x": x, "trips": np.array(2000, np.int64)})
    # 2000 rows are 2 GiB (without the budget ORT's arena kept 4 GiB afterwards); refused at 16 MiB, the process
    # holds well under 100 MiB more.
    assert _rss_mib() - before < 100, (before, _rss_mib())
    # The session runs loops that fit afterwards.
    out = session.run({"x": x, "trips": np.array(5, np.int64)})
    np.testing.assert_array_equal(out["rows"][:, 7], [2.0, 3.0, 4.0, 5.0, 6.0])
    np.testing.assert_array_equal(out["acc"][:3], [6.0, 6.0, 6.0])


@requires_ort
def test_onnxruntime_sessions_without_a_limit_are_unbounded_and_explain_the_limit():
    model = rows_loop_model()
    x = np.ones(ROW, np.float32)
    unlimited = xrt.InferenceSession(model, engine="onnxruntime")
    assert unlimited.run({"x": x, "trips": np.array(40, np.int64)})["rows"].shape == (40, ROW)  # 40 MiB, no limit
    limited = xrt.InferenceSession(model, engine="onnxruntime", exec_policy=xrt.ExecutionPolicy(memory_limit="16MiB"))
    notes = " ".join(limited.explain().policy_notes)
    assert "memory_limit -> each run's CPU allocations charged" in notes, notes
    assert limited.run({"x": x, "trips": np.array(3, np.int64)})["rows"].shape == (3, ROW)
