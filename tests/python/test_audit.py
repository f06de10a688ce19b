"""The roofline audit (issue 42, item 1; docs/profiling.md "Roofline audit"): the profiler's per-node floor and
efficiency, explain()'s report, and ``xpuruntime audit``. A model built here (MatMul of odd sizes, Relu, Softmax) runs on
the CPU; the CUDA case runs only with a GPU."""

from __future__ import annotations

import io
import json
import sys
from typing import Tuple

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import xpuruntime as xrt
from xpuruntime import cli, report

from conftest import requires_gpu, requires_ort

BATCH, K, N = 3, 37, 29  # odd sizes


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Softmax", ["r"], ["y"], name="softmax", axis=-1)]
    graph = helper.make_graph(nodes, "audit", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", N])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path_factory.mktemp("audit") / "audit.onnx"
    onnx.save(model, str(path))
    return str(path)


def run_cli(*args: str) -> Tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.stdout, sys.stderr = old
    return code, out.getvalue(), err.getvalue()


def profiled(model_path: str, runs: int = 3, device: str = "cpu"):
    session = xrt.InferenceSession(model_path, engine="native", device=device)
    x = np.random.default_rng(1).standard_normal((BATCH, K)).astype(np.float32)
    session.run({"x": x})
    with xrt.profile(cuda=None if device != "cpu" else False) as p:
        for _ in range(runs):
            session.run({"x": x})
    return session, p


def node_row(rows, op_type: str):
    found = [r for r in rows if r["op_type"] == op_type or r["op"] == op_type]
    assert found, f"no {op_type} row in {[(r['node'], r['op_type'], r['op']) for r in rows]}"
    return found[0]


def test_summary_rows_carry_the_roofline(model_path):
    _, p = profiled(model_path, runs=3)
    p.set_ceilings("cpu", bandwidth=1e9, fp32=2e9, vector=1e9)  # 1 byte/ns, 2 FLOP/ns: exact floors
    rows = p.summary()
    mm = next(r for r in rows if r["op"] in ("matmul", "linear"))
    assert mm["flops"] == pytest.approx(3 * 2.0 * BATCH * K * N)
    floor_bytes = 3 * 4.0 * (BATCH * K + K * N + BATCH * N)
    assert mm["floor_bytes"] == pytest.approx(floor_bytes)
    assert mm["ceiling"] == "fp32" and mm["device"] == "cpu" and mm["reason"]
    assert mm["floor_us"] == pytest.approx(max(floor_bytes, mm["flops"] / 2) / 1e3, abs=2e-3)
    assert mm["bound"] == ("memory" if floor_bytes > mm["flops"] / 2 else "compute")
    for r in rows:
        if not r["ceiling"]:
            assert r["floor_us"] == 0 and r["efficiency"] == 0 and not r["flagged"]
            continue
        assert r["efficiency"] == pytest.approx(r["floor_us"] / r["total_us"], rel=1e-3)
        assert r["lost_share"] == pytest.approx(r["share"] * max(0.0, 1 - r["efficiency"]))
        assert r["flagged"] == (r["share"] > 0.02 and r["efficiency"] < 0.5)
    sm = node_row(rows, "Softmax")
    assert sm["ceiling"] == "vector" and sm["flops"] == pytest.approx(3 * 5.0 * BATCH * N)
    audit = p.audit()
    assert [r["lost_share"] for r in audit] == sorted((r["lost_share"] for r in audit), reverse=True)
    assert len(p.audit(1)) == 1 and p.audit(1)[0]["node"] == audit[0]["node"]
    assert "efficiency" in p.summary_table()


def test_ceilings_measured_then_overridden(model_path):
    _, p = profiled(model_path, runs=1)
    c = p.ceilings("cpu")
    assert c["bandwidth"] > 1e8 and c["peaks"]["fp32"] > 1e8
    assert "measured" in c["source"]["bandwidth"] and "measured" in c["source"]["fp32"]
    p.set_ceilings("cpu", bandwidth=123.0)
    assert p.ceilings("cpu")["bandwidth"] == 123.0 and p.ceilings("cpu")["source"]["bandwidth"] == "override: given"
    with pytest.raises(xrt.InvalidArgumentError, match="unknown roofline ceiling"):
        p.set_ceilings("cpu", fp99=1.0)
    with pytest.raises(xrt.InvalidArgumentError, match="positive"):
        p.set_ceilings("cpu", fp16=-1.0)
    with pytest.raises(xrt.InvalidTypeError):
        p.set_ceilings("cpu", fp16="fast")


def test_explain_report_shows_floor_and_efficiency(model_path):
    session, p = profiled(model_path, runs=2)
    data = report.build_report(session, model=model_path, events=p.events(), summary=p.summary())
    timed = [n for n in data["nodes"] if n.get("floor_us")]
    assert timed, data["nodes"]
    for n in timed:
        assert n["efficiency"] > 0 and n["ceiling"] in ("fp32", "vector")
    text = report.render(data, "text")
    header = next(line for line in text.splitlines() if line.startswith("node "))
    assert header.split()[-2:] == ["floor", "eff"]
    assert "floor = max(bytes / copy bandwidth, FLOPs / peak)" in text


def test_cli_audit_text(model_path):
    code, out, err = run_cli("audit", model_path, "--engine", "native", "-n", "3", "--batch", "5")
    assert code == 0, err
    assert "ceilings of cpu: copy bandwidth" in out and "why each kernel was chosen:" in out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("node"))
    assert header.split() == ["node", "op", "kernel", "time", "share", "floor", "bound", "eff", "lost"]
    assert "mm" in out and "softmax" in out
    assert "by op and kernel (every audited node):" in out


def test_cli_audit_json_ranks_by_lost_share(model_path):
    code, out, err = run_cli("audit", model_path, "--engine", "native", "-n", "2", "--json",
                             "--ceiling", "bandwidth=1e9,fp32=2e9", "--ceiling", "vector=1e9")
    assert code == 0, err
    data = json.loads(out)
    c = data["ceilings"]["cpu"]
    assert c["bandwidth"] == 1e9 and c["peaks"]["fp32"] == 2e9 and c["peaks"]["vector"] == 1e9
    assert c["source"]["fp32"] == "override: given"
    nodes = data["nodes"]
    assert nodes and all(n["floor_us"] > 0 for n in nodes)
    assert [n["lost_share"] for n in nodes] == sorted((n["lost_share"] for n in nodes), reverse=True)
    mm = next(n for n in nodes if n["op"] in ("matmul", "linear"))
    assert mm["flops"] == pytest.approx(2 * 2.0 * 1 * K * N)  # 2 runs at the default batch, 1
    groups = data["groups"]
    assert sum(g["nodes"] for g in groups) == len(nodes)
    assert sum(g["share"] for g in groups) == pytest.approx(sum(n["share"] for n in nodes))
    code, out, _ = run_cli("audit", model_path, "--engine", "native", "-n", "1", "--json", "--top", "1")
    assert code == 0 and len(json.loads(out)["nodes"]) == 1
    assert sum(g["nodes"] for g in json.loads(out)["groups"]) > 1  # groups cover every node, not the top ones


def test_audit_groups_sum_a_models_small_nodes():
    """Ninety small nodes of one op and kernel, none over 2% of the run, are one flagged group (SSDlite's TopKs)."""
    from xpuruntime.cli import audit_groups

    def row(node, op, kernel, mean_us, floor_us, share):
        return {"node": node, "op": op, "op_type": "", "kernel": kernel, "backend": "cuda_raw", "calls": 2,
                "mean_us": mean_us, "floor_us": 2 * floor_us, "share": share}

    rows = [row(f"topk_{i}", "top_k", "cuda_raw", 40.0, 1.0, 0.004) for i in range(90)]
    rows += [row("nms", "non_max_suppression", "cuda_raw", 5000.0, 1.0, 0.5), row("conv", "conv2d", "cudnn", 10.0,
                                                                                  9.0, 0.01)]
    groups = audit_groups(rows)
    assert [g["op"] for g in groups] == ["non_max_suppression", "top_k", "conv2d"]
    topk = groups[1]
    assert topk["nodes"] == 90 and topk["time_us"] == pytest.approx(3600.0) and topk["floor_us"] == pytest.approx(90.0)
    assert topk["share"] == pytest.approx(0.36) and topk["efficiency"] == pytest.approx(0.025)
    assert topk["lost_share"] == pytest.approx(0.36 * 0.975) and topk["flagged"]
    assert groups[2]["efficiency"] == pytest.approx(0.9) and not groups[2]["flagged"]


@pytest.mark.parametrize("bad", ["bandwidth", "fp16=-2", "fp16=abc", "nonsense=1"])
def test_cli_audit_rejects_bad_ceilings(model_path, bad):
    code, out, err = run_cli("audit", model_path, "--ceiling", bad)
    assert code == 2 and "Traceback" not in err and "ceiling" in err


@requires_ort
def test_cli_audit_onnxruntime_nodes_from_their_shapes(model_path):
    code, out, err = run_cli("audit", model_path, "--engine", "onnxruntime", "-n", "2", "--json")
    assert code == 0, err
    nodes = json.loads(out)["nodes"]
    mm = next(n for n in nodes if n["op_type"] == "MatMul")
    assert mm["flops"] == pytest.approx(2 * 2.0 * 1 * K * N) and mm["ceiling"] == "fp32"


@requires_gpu
@pytest.mark.parametrize("batch", [1, 7])
def test_cuda_audit_matches_cpu_work(model_path, batch):
    """On a GPU: the same nodes have the same FLOPs as on the CPU, floors from the copy probe and the table, and
    efficiencies in (0, 10]."""
    code, out, err = run_cli("audit", model_path, "--engine", "native", "--device", "cuda", "-n", "3", "--json",
                             "--batch", str(batch))
    assert code == 0, err
    data = json.loads(out)
    c = data["ceilings"]["cuda:0"]
    assert "measured" in c["source"]["bandwidth"] and "table" in c["source"]["fp32"]
    assert c["bandwidth"] > 1e11 and c["peaks"]["fp16"] >= c["peaks"]["fp32"] > 1e12
    mm = next(n for n in data["nodes"] if n["op"] in ("matmul", "linear"))
    assert mm["flops"] == pytest.approx(3 * 2.0 * batch * K * N)
    assert mm["device"] == "cuda:0"
    for n in data["nodes"]:
        assert 0 < n["efficiency"] <= 10, n
