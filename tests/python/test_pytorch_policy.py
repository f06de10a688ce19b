"""xpuruntime.pytorch on the CPU: policies with PyTorch's kernel names, routing, gradients, the decision log,
autocast and errors. Tests that need torch skip without it; GPU tests are in test_pytorch_gpu.py."""

import json
import math

import numpy as np
import pytest

import xpuruntime as xrt
from torch_export import export_onnx

TORCH_KERNELS = {
    "matmul": {"torch", "torch_cublas", "torch_cublaslt"},
    "linear": {"torch", "torch_cublas", "torch_cublaslt"},
    "conv2d": {"torch", "torch_cudnn"},
    "attention": {"torch", "torch_flash", "torch_efficient", "torch_math", "torch_cudnn"},
}


# ---- PyTorch's kernel names in a KernelPolicy (no torch needed) ----

def test_the_registry_declares_pytorch_kernels_as_external():
    for op, names in TORCH_KERNELS.items():
        declared = xrt._core.external_kernels(op)
        assert {k["name"] for k in declared} == names
        assert all(k["runner"] == "pytorch" and k["summary"] for k in declared)
        assert names <= set(xrt._core.kernel_names(op))
    assert "torch_flash" in xrt._core.kernel_names("attention")
    # They are names, not kernels: the priority lists are xpuruntime's own.
    assert not any(k.name.startswith("torch") for k in xrt.kernels())


def test_a_policy_with_pytorch_kernels_validates_and_round_trips(tmp_path):
    policy = xrt.KernelPolicy(matmul="torch_cublaslt", attention=["flash_v2", "torch_flash"], conv="pin:torch_cudnn")
    path = tmp_path / "train.json"
    policy.save(path)
    loaded = xrt.KernelPolicy.load(path)
    assert loaded == policy
    assert loaded.get("attention") == policy.get("attention")
    assert json.loads(path.read_text())["rules"]["matmul"] == {"kernels": ["torch_cublaslt"], "mode": "preferred"}
    with pytest.raises(xrt.InvalidArgumentError, match=r"unknown kernel 'torch_flsh' for 'attention'.*torch_flash"):
        xrt.KernelPolicy(attention="torch_flsh")
    with pytest.raises(xrt.InvalidArgumentError, match="unknown kernel 'torch_flash' for 'matmul'"):
        xrt.KernelPolicy(matmul="torch_flash")


def test_the_dispatcher_skips_pytorch_kernels_with_the_reason():
    a = np.ones((4, 8), np.float32)
    b = np.ones((8, 3), np.float32)
    y, decision = xrt.ops.matmul(a, b, policy=xrt.KernelPolicy(matmul=["torch_cublaslt", "cpu"]),
                                 return_decision=True)
    np.testing.assert_allclose(y.numpy(), a @ b)
    assert decision.kernel == "cpu" and decision.rule == "preferred"
    assert "torch_cublaslt" in decision.reason and "xpuruntime.pytorch" in decision.reason
    external = [c for c in decision.candidates if c["kernel"] == "torch_cublaslt"]
    assert external and external[0]["backend"] == "pytorch" and not external[0]["supported"]
    with pytest.raises(xrt.UnsupportedOperationError, match=r"pins 'torch_cublaslt'.*PyTorch.*could run"):
        xrt.ops.matmul(a, b, policy=xrt.KernelPolicy(matmul="pin:torch_cublaslt"))


def test_functional_ops_write_into_caller_outputs_and_report_the_plan():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((4, 2), np.float32)
    decision, outputs, workspace = xrt._core.ops_plan("matmul", [a, b])
    assert outputs == [([3, 2], "float32")] and workspace == 0 and decision.kernel == "cpu"
    out = np.zeros((3, 2), np.float32)
    y = xrt.ops.matmul(a, b, out=out)
    np.testing.assert_allclose(out, a @ b)
    assert np.shares_memory(np.from_dlpack(y), out)
    with pytest.raises(xrt.InvalidArgumentError, match=r"expected output 0 as a contiguous float32\[3, 2\]"):
        xrt.ops.matmul(a, b, out=np.zeros((2, 3), np.float32))
    candidates = xrt._core.ops_candidates("matmul", [a, b])
    assert [c["kernel"] for c in candidates][-1] == "cpu" and candidates[-1]["supported"]


# ---- routing on the CPU (needs torch) ----

@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    return torch


@pytest.fixture
def xrt_torch(torch):
    import xpuruntime.pytorch as xrt_torch

    yield xrt_torch
    xrt_torch.set_kernel_policy(None)


def _grads(params):
    return [p.grad.detach().clone() for p in params]


def _reference_grads(layer, x):
    """The output and gradients of x, weight and bias of ``layer(x).square().sum()`` on PyTorch (grads cleared)."""
    reference = layer(x)
    reference.square().sum().backward()
    grads = _grads([x, layer.weight, layer.bias])
    for p in (x, layer.weight, layer.bias):
        p.grad = None
    return reference, grads


def test_linear_routes_to_the_cpu_kernel_with_matching_gradients(torch, xrt_torch):
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 10)
    x = torch.randn(5, 7, 24, requires_grad=True)
    reference, ref_grads = _reference_grads(layer, x)

    scope = xrt_torch.set_kernel_policy(matmul="cpu")
    y = layer(x)
    y.square().sum().backward()
    torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-5)
    for got, want in zip(_grads([x, layer.weight, layer.bias]), ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    records = {r["node"]: r for r in scope.log.records}
    forward = records["linear#0"]
    assert forward["kernel"] == "cpu" and forward["backend"] == "cpu" and forward["rule"] == "preferred"
    assert forward["op_type"] == "F.linear" and forward["calls"] == 1 and forward["precision"] == "fp32"
    assert forward["signature"] == "float32[5, 7, 24], float32[10, 24], float32[10]; activation=none, weight_layout=nk"
    assert {c["kernel"] for c in forward["rejected"]} >= {"cublasLt", "torch", "torch_cublaslt"}
    assert "grad input" in forward["backward"]
    grad_input = [r for r in scope.log.records if r["phase"] == "backward: grad input"]
    assert grad_input and grad_input[0]["kernel"] == "cpu" and grad_input[0]["op"] == "matmul"
    grad_weight = [r for r in scope.log.records if r["phase"] == "backward: grad weight"]
    # gradᵀ @ x and the bias gradient: xpuruntime's linear_grad_weight under the same rule, one call.
    assert grad_weight and grad_weight[0]["kernel"] == "cpu" and grad_weight[0]["op"] == "linear_grad_weight"
    assert grad_weight[0]["signature"] == "float32[35, 10], float32[35, 24]; bias=1"


def test_grad_weight_falls_back_to_pytorch_where_the_rule_has_no_linear_grad_weight(torch, xrt_torch, monkeypatch):
    """A linear rule whose kernel has no linear_grad_weight (cublas): PyTorch's GEMM on the forward kernel's library
    runs grad weight, a sum runs grad bias, and the log says so."""
    from xpuruntime.pytorch import _kernels

    monkeypatch.setattr(_kernels, "decide_grad_weight", lambda *args: None)
    layer = torch.nn.Linear(6, 4)
    x = torch.randn(3, 6, requires_grad=True)
    _, ref_grads = _reference_grads(layer, x)
    scope = xrt_torch.set_kernel_policy(matmul="cpu")
    layer(x).square().sum().backward()
    for got, want in zip(_grads([x, layer.weight, layer.bias]), ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    grad_weight = [r for r in scope.log.records if r["phase"] == "backward: grad weight"]
    assert grad_weight and grad_weight[0]["kernel"] == "torch" and grad_weight[0]["backend"] == "pytorch"
    assert "transposed operand" in grad_weight[0]["reason"]


def test_calls_are_deduplicated_per_signature_with_a_count(torch, xrt_torch):
    scope = xrt_torch.set_kernel_policy(matmul="cpu")
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    for _ in range(3):
        torch.matmul(a, b)
    a @ b
    torch.matmul(torch.randn(2, 4), b)
    records = [r for r in scope.log.records if r["op"] == "matmul"]
    assert [r["calls"] for r in records] == [4, 1]
    assert records[0]["op_type"] == "torch.matmul" and records[1]["node"] == "matmul#1"
    torch.testing.assert_close(a @ b, torch.mm(a.double(), b.double()).float(), rtol=1e-5, atol=1e-5)


def test_batched_matmul_with_broadcast_and_its_gradients(torch, xrt_torch):
    torch.manual_seed(1)
    a = torch.randn(2, 3, 5, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 7, 4, dtype=torch.float64, requires_grad=True)
    ref = torch.matmul(a, b)
    ga, gb = torch.autograd.grad(ref.sin().sum(), (a, b))
    xrt_torch.set_kernel_policy(matmul="pin:cpu")
    y = a @ b
    ga2, gb2 = torch.autograd.grad(y.sin().sum(), (a, b))
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(ga2, ga)
    torch.testing.assert_close(gb2, gb)
    assert xrt_torch.decision_log().kernels() == {"matmul": ["cpu"]}


def test_conv2d_routes_with_matching_gradients(torch, xrt_torch):
    torch.manual_seed(2)
    conv = torch.nn.Conv2d(3, 6, kernel_size=3, stride=2, padding=1, dilation=1, groups=1)
    x = torch.randn(2, 3, 11, 9, requires_grad=True)
    ref = conv(x)
    ref.square().sum().backward()
    ref_grads = _grads([x, conv.weight, conv.bias])
    for p in (x, conv.weight, conv.bias):
        p.grad = None
    scope = xrt_torch.set_kernel_policy(conv="cpu")
    y = conv(x)
    y.square().sum().backward()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
    for got, want in zip(_grads([x, conv.weight, conv.bias]), ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    forward = scope.log.records[0]
    assert forward["op"] == "conv2d" and forward["kernel"] == "cpu"
    assert "strides=[2, 2]" in forward["signature"] and "pads=[1, 1, 1, 1]" in forward["signature"]
    assert any(r["phase"] == "backward" and r["op"] == "conv2d" for r in scope.log.records)


def test_grouped_and_same_padded_conv(torch, xrt_torch):
    torch.manual_seed(3)
    x = torch.randn(1, 4, 8, 8)
    w = torch.randn(8, 2, 3, 3)
    ref = torch.nn.functional.conv2d(x, w, None, 1, "same", 1, 2)
    xrt_torch.set_kernel_policy(conv="cpu")
    y = torch.nn.functional.conv2d(x, w, None, 1, "same", 1, 2)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
    even = torch.nn.functional.conv2d(x, torch.randn(8, 2, 2, 2), None, 1, "same", 1, 2)
    assert even.shape == (1, 8, 8, 8)
    reasons = [r["reason"] for r in xrt_torch.decision_log().records if r["rule"] == "fallback"]
    assert any("asymmetric" in r for r in reasons)


def test_ops_without_a_rule_stay_on_pytorch_and_are_logged(torch, xrt_torch):
    scope = xrt_torch.set_kernel_policy(attention="cpu")
    layer = torch.nn.Linear(4, 3)
    layer(torch.randn(2, 4))
    (record,) = scope.log.records
    assert record["kernel"] == "torch" and record["rule"] == "unrouted"
    assert "no rule for 'linear' or its family 'matmul'" in record["reason"]


def test_preferred_gpu_kernels_fall_back_to_pytorch_on_the_cpu_and_pinned_raises(torch, xrt_torch):
    scope = xrt_torch.set_kernel_policy(matmul=["cublasLt", "cublas"])
    torch.matmul(torch.randn(2, 3), torch.randn(3, 4))
    (record,) = scope.log.records
    assert record["kernel"] == "torch" and record["rule"] == "fallback"
    assert "cublasLt: runs on CUDA devices" in record["reason"]
    xrt_torch.set_kernel_policy(matmul="pin:cublasLt")
    with pytest.raises(xrt.UnsupportedOperationError, match=r"pinned kernel 'cublasLt' cannot run matmul.*cpu"):
        torch.matmul(torch.randn(2, 3), torch.randn(3, 4))
    xrt_torch.set_kernel_policy(matmul="pin:torch_cublaslt")
    with pytest.raises(xrt.UnsupportedOperationError, match="pinned kernel 'torch_cublaslt'"):
        torch.matmul(torch.randn(2, 3), torch.randn(3, 4))


def test_calls_xpuruntime_cannot_take_stay_on_pytorch_with_the_reason(torch, xrt_torch):
    scope = xrt_torch.set_kernel_policy(matmul="cpu")
    v = torch.randn(3)
    m = torch.randn(4, 3)
    torch.testing.assert_close(torch.matmul(m, v), m @ v)
    torch.matmul(torch.randn(2, 3, dtype=torch.float64).to(torch.int64), torch.ones(3, 2, dtype=torch.int64))
    reasons = [r["reason"] for r in scope.log.records]
    assert any("1-D operand" in r for r in reasons)
    assert any("floating-point" in r for r in reasons)
    with pytest.raises(RuntimeError):  # PyTorch's own error for a shape mismatch, untouched
        torch.matmul(torch.randn(2, 3), torch.randn(4, 2))


def test_unknown_kernels_and_bad_arguments_are_typed_errors(torch, xrt_torch):
    with pytest.raises(xrt.InvalidArgumentError, match=r"unknown kernel 'flash_v3' for 'attention'.*torch_flash"):
        xrt_torch.set_kernel_policy(attention="flash_v3")
    with pytest.raises(xrt.InvalidArgumentError, match="unknown op 'atention'"):
        xrt_torch.set_kernel_policy(atention="flash_v2")
    with pytest.raises(xrt.InvalidTypeError, match="policy must be a KernelPolicy"):
        xrt_torch.set_kernel_policy(42)
    with pytest.raises(xrt.InvalidArgumentError, match="unknown ExecutionPolicy field"):
        xrt_torch.set_kernel_policy(matmul="cpu", exec_policy={"precison": "tf32"})
    with pytest.raises(xrt.InvalidArgumentError, match="valid formats"):
        xrt_torch.set_kernel_policy(matmul="cpu")
        xrt_torch.explain(format="pdf")


def test_scopes_nest_and_routing_turns_off(torch, xrt_torch):
    from torch.overrides import _get_current_function_mode_stack

    outer = xrt_torch.set_kernel_policy(matmul="cpu")
    assert xrt_torch.get_kernel_policy() == xrt.KernelPolicy(matmul="cpu")
    with xrt_torch.set_kernel_policy(matmul="torch") as inner:
        assert xrt_torch.current_scope() is inner
        torch.matmul(torch.randn(2, 2), torch.randn(2, 2))
    assert xrt_torch.current_scope() is outer
    assert inner.log.records[0]["kernel"] == "torch" and inner.log.records[0]["rule"] == "preferred"
    with xrt_torch.set_kernel_policy(None):
        assert xrt_torch.current_scope() is None
        torch.matmul(torch.randn(2, 2), torch.randn(2, 2))
    assert xrt_torch.current_scope() is outer and len(outer.log) == 0
    xrt_torch.set_kernel_policy(None)
    assert xrt_torch.get_kernel_policy() is None
    assert not any(type(m).__name__ == "RoutingMode" for m in _get_current_function_mode_stack())


def test_the_same_policy_file_drives_training(torch, xrt_torch, tmp_path):
    path = tmp_path / "policy.json"
    xrt.KernelPolicy(matmul="cpu", attention=["flash_v2", "torch_flash"]).save(path)
    scope = xrt_torch.set_kernel_policy(path)
    assert scope.policy == xrt.KernelPolicy.load(path)
    torch.nn.Linear(3, 2)(torch.randn(4, 3))
    assert scope.log.kernels() == {"linear": ["cpu"]}
    scope2 = xrt_torch.set_kernel_policy(xrt.KernelPolicy.load(path), matmul="torch", exec_policy={"precision": "tf32"})
    assert scope2.policy.get("matmul") == "torch" and scope2.exec_policy.precision == "tf32"


def test_the_decision_log_is_an_explain_report(torch, xrt_torch):
    from xpuruntime import report

    xrt_torch.set_kernel_policy(matmul="cpu")
    torch.nn.Linear(3, 2)(torch.randn(4, 3))
    data = xrt_torch.explain(format="dict")
    assert data["schema"] == report.SCHEMA and data["engine"] == "pytorch"
    node = data["nodes"][0]
    for key in ("node", "op_type", "op", "kernel", "backend", "precision", "rule", "policy_rule", "reason",
                "candidates", "rejected", "calls", "phase", "signature"):
        assert key in node, key
    text = xrt_torch.explain()
    assert "linear#0" in text and "F.linear" in text and "preferred by the KernelPolicy" in text
    assert json.loads(xrt_torch.explain(format="json"))["nodes"][0]["kernel"] == "cpu"
    assert "<script" in xrt_torch.explain(format="html")
    assert "1 call sites" in repr(xrt_torch.decision_log())


def test_autocast_casts_routed_calls_like_torch_autocast(torch, xrt_torch):
    scope = xrt_torch.set_kernel_policy(matmul=["cpu", "torch"])
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = layer(x)
    with xrt_torch.autocast(bf16=True, device_type="cpu"):
        got = layer(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    (record,) = [r for r in scope.log.records if r["op"] == "linear"]
    assert record["precision"] == "bf16" and record["signature"].startswith("bfloat16[3, 8]")


def test_autocast_precision_names_and_errors(torch, xrt_torch):
    assert xrt_torch.autocast(fp16=True).precision == "fp16"
    assert xrt_torch.autocast(xrt.ExecutionPolicy(precision="bf16")).precision == "bf16"
    assert xrt_torch.autocast().precision == "fp32"
    xrt_torch.set_kernel_policy(matmul="cpu", exec_policy=xrt.ExecutionPolicy(precision="tf32"))
    assert xrt_torch.autocast().precision == "tf32"
    with pytest.raises(xrt.InvalidArgumentError, match="not both"):
        xrt_torch.autocast(fp16=True, bf16=True)
    with pytest.raises(xrt.InvalidArgumentError, match="unknown precision 'int8'"):
        xrt_torch.autocast("int8")
    with pytest.raises(xrt.InvalidArgumentError, match="contradicts"):
        xrt_torch.autocast("fp32", fp16=True)
    before = torch.backends.cuda.matmul.allow_tf32
    with xrt_torch.autocast("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_autocast_tf32_reaches_xpuruntime_kernels(torch, xrt_torch):
    scope = xrt_torch.set_kernel_policy(matmul="cpu")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with xrt_torch.autocast("tf32"):
        torch.matmul(a, b)
    torch.matmul(a, b)
    precisions = [r["precision"] for r in scope.log.records]
    assert precisions == ["tf32", "fp32"]


def test_a_small_model_trains_the_same_routed_and_unrouted(torch, xrt_torch):
    def run(routed):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        data = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
        target = data.sum(1, keepdim=True).sin()
        if routed:
            xrt_torch.set_kernel_policy(matmul="cpu")
        losses = []
        for _ in range(40):
            loss = (model(data) - target).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        xrt_torch.set_kernel_policy(None)
        return losses

    reference, routed = run(False), run(True)
    np.testing.assert_allclose(routed, reference, rtol=1e-4, atol=1e-5)
    assert routed[-1] < routed[0] * 0.8


def test_attention_through_the_custom_op_on_the_cpu(torch, xrt_torch):
    from xpuruntime.pytorch import _ops

    torch.manual_seed(4)
    q = torch.randn(2, 4, 5, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 7, 8, dtype=torch.float64, requires_grad=True)  # GQA: 2 kv heads for 4 query heads
    v = torch.randn(2, 2, 7, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.randn(1, 1, 5, 7, dtype=torch.float64)
    scale = 0.3

    def reference(q, k, v):
        kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        s = q @ kr.transpose(-1, -2) * scale + mask
        return torch.softmax(s, -1) @ vr

    want = reference(q, k, v)
    want_grads = torch.autograd.grad(want.cos().sum(), (q, k, v))
    scope = xrt_torch.set_kernel_policy(attention="cpu")
    route = xrt_torch._kernels.decide_attention(scope.state, q, k, v, mask, False, scale, True)
    assert route.kernel == "cpu" and route.on_xpuruntime
    got = _ops.attention(q, k, v, mask, False, scale, True, scope.state.id, route.id)
    got_grads = torch.autograd.grad(got.cos().sum(), (q, k, v))
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w)
    backward = [r for r in scope.log.records if r["phase"] == "backward"]
    assert backward[0]["kernel"] == "torch_math" and "no backward kernel" in backward[0]["reason"]


@pytest.mark.parametrize("causal", [False, True])
def test_the_math_attention_backward_matches_autograd(torch, causal):
    from xpuruntime.pytorch import _kernels

    torch.manual_seed(5)
    q = torch.randn(1, 2, 6, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 9, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 9, 3, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(1, 2, 6, 3, dtype=torch.float64)
    s = q @ k.transpose(-1, -2) / math.sqrt(4)
    if causal:
        s = s.masked_fill(torch.ones(6, 9, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ v
    want = torch.autograd.grad(out, (q, k, v), grad)
    got = _kernels._math_attention_backward(grad, q.detach(), k.detach(), v.detach(), None, causal, 1 / math.sqrt(4))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_sdpa_routes_on_the_cpu(torch, xrt_torch):
    F = torch.nn.functional
    if not hasattr(F, "scaled_dot_product_attention"):
        pytest.skip("this PyTorch has no scaled_dot_product_attention (needs >= 2.0)")
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 3, 10, 16, requires_grad=True) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    want_grads = torch.autograd.grad(want.sum(), (q, k, v))
    scope = xrt_torch.set_kernel_policy(attention="cpu")
    got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got_grads = torch.autograd.grad(got.sum(), (q, k, v))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert scope.log.records[0]["kernel"] == "cpu" and "causal=1" in scope.log.records[0]["signature"]
    bool_mask = torch.ones(10, 10, dtype=torch.bool).tril()
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask), want,
                               rtol=1e-4, atol=1e-5)
    F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert any("no dropout" in r["reason"] for r in scope.log.records)


def test_capture_graph_needs_cuda(torch, xrt_torch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: test_pytorch_gpu.py covers capture_graph")
    with pytest.raises(xrt.UnsupportedOperationError, match="CUDA"):
        xrt_torch.capture_graph(lambda x: x * 2, torch.ones(3))
    with pytest.raises(xrt.UnsupportedOperationError, match="CUDA"):
        with xrt_torch.capture_graph():
            pass
    with pytest.raises(xrt.InvalidArgumentError, match="without a function"):
        xrt_torch.capture_graph(None, torch.ones(3))


def test_training_and_inference_choose_the_same_kernels_from_one_file(torch, xrt_torch, tmp_path):
    pytest.importorskip("onnx", reason="InferenceSession's native engine reads ONNX (python3-onnx)")
    path = tmp_path / "policy.json"
    xrt.KernelPolicy(matmul="cpu").save(path)
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(2, 8)
    scope = xrt_torch.set_kernel_policy(path)
    y = model(x)
    xrt_torch.set_kernel_policy(None)
    onnx_path = tmp_path / "mlp.onnx"
    export_onnx(model, x, onnx_path)
    sess = xrt.InferenceSession(onnx_path, device="cpu", engine="native", kernel_policy=xrt.KernelPolicy.load(path))
    out = sess.run({"x": x.numpy()})["y"]
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-4, atol=1e-5)
    inference = {n["op"]: n["kernel"] for n in sess.explain().nodes if n["op"] in ("linear", "matmul")}
    training = {op: kernels[0] for op, kernels in scope.log.kernels().items()}
    assert inference and set(inference.values()) == {"cpu"}
    assert training == {"linear": "cpu"}


def test_setting_the_same_policy_again_reuses_its_decisions_with_a_fresh_log(torch, xrt_torch):
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    first = xrt_torch.set_kernel_policy(matmul="cpu")
    torch.matmul(a, b)
    second = xrt_torch.set_kernel_policy(xrt.KernelPolicy(matmul="cpu"))
    assert len(second.log) == 0 and len(first.log) == 1
    torch.matmul(a, b)
    assert second.state is first.state  # one PolicyState per distinct pair of policies: decisions and plans kept
    assert second.log.records[0]["calls"] == 1
    other = xrt_torch.set_kernel_policy(matmul="cpu", exec_policy={"precision": "tf32"})
    assert other.state is not first.state


# ---- The eager fast path: one decided site per call signature (Note [Call sites] in pytorch/_fast.py) ----

def test_repeated_calls_reuse_their_site_with_fresh_data_and_gradients(torch, xrt_torch):
    from xpuruntime.pytorch import _fast

    torch.manual_seed(11)
    weight = torch.randn(6, 9, requires_grad=True)
    bias = torch.randn(6, requires_grad=True)
    scope = xrt_torch.set_kernel_policy(matmul="cpu")
    for step in range(4):
        x = torch.randn(3, 9, requires_grad=True)
        y = torch.nn.functional.linear(x, weight, bias)
        y.pow(3).sum().backward()
        got = [x.grad.clone(), weight.grad.clone(), bias.grad.clone()]
        for t in (x, weight, bias):
            t.grad = None
        with xrt_torch.set_kernel_policy(None):
            ref = torch.nn.functional.linear(x, weight, bias)
            ref.pow(3).sum().backward()
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
        for g, t in zip(got, (x, weight, bias)):
            torch.testing.assert_close(g, t.grad, rtol=1e-4, atol=1e-4)
            t.grad = None
    assert any(site.route.kernel == "cpu" for site in _fast.SITES.values() if isinstance(site, _fast.Site))
    records = {r["node"]: r for r in scope.log.records}
    assert records["linear#0"]["calls"] == 4 and records["linear#0"]["kernel"] == "cpu"
    assert records["matmul#0 (backward: grad input)"]["calls"] == 4
    assert records["linear_grad_weight#0 (backward: grad weight)"]["calls"] == 4


def test_strided_and_misaligned_inputs_on_the_fast_path(torch, xrt_torch):
    torch.manual_seed(12)
    xrt_torch.set_kernel_policy(matmul="pin:cpu")
    a = torch.randn(7, 5).t()          # not contiguous: copied per call
    storage = torch.randn(1 + 7 * 4)
    b = storage[1:].view(7, 4)         # 4-byte aligned view: below the plan's 16 bytes, copied first
    assert b.data_ptr() % 16 != 0
    for _ in range(3):
        torch.testing.assert_close(torch.matmul(a, b), torch.mm(a.double(), b.double()).float(), rtol=1e-5,
                                   atol=1e-5)
    aligned = torch.randn(7, 4)
    torch.testing.assert_close(torch.matmul(a, aligned), torch.mm(a.double(), aligned.double()).float(), rtol=1e-5,
                               atol=1e-5)
    assert xrt_torch.decision_log().records[0]["calls"] == 4


def test_calls_without_a_rule_are_logged_on_every_call(torch, xrt_torch):
    scope = xrt_torch.set_kernel_policy(attention="cpu")
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    for _ in range(3):
        torch.testing.assert_close(torch.nn.functional.linear(x, w), x @ w.t())
    records = [r for r in scope.log.records if r["op"] == "linear"]
    assert len(records) == 1 and records[0]["rule"] == "unrouted" and records[0]["calls"] == 3


def test_grad_mode_and_autocast_are_part_of_the_signature(torch, xrt_torch):
    torch.manual_seed(13)
    w = torch.randn(4, 8, requires_grad=True)
    x = torch.randn(3, 8)
    xrt_torch.set_kernel_policy(matmul="cpu")
    with torch.no_grad():
        y0 = torch.nn.functional.linear(x, w)
    assert y0.grad_fn is None
    y1 = torch.nn.functional.linear(x, w)
    assert y1.grad_fn is not None
    (g,) = torch.autograd.grad(y1.sum(), w)
    torch.testing.assert_close(g, x.sum(0).expand(4, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y2 = torch.nn.functional.linear(x, w)
    assert y2.dtype == torch.bfloat16
    torch.testing.assert_close(y2.float(), y0, rtol=3e-2, atol=3e-2)


def test_double_backward_through_a_routed_linear(torch, xrt_torch):
    torch.manual_seed(14)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)

    def second(fn):
        (gx,) = torch.autograd.grad(fn(x, w).pow(2).sum(), x, create_graph=True)
        return torch.autograd.grad(gx.sum(), w)[0]

    want = second(torch.nn.functional.linear)
    xrt_torch.set_kernel_policy(matmul="cpu")
    torch.testing.assert_close(second(torch.nn.functional.linear), want)


def test_prepared_calls_from_python():
    a = np.arange(15, dtype=np.float32).reshape(3, 5) / 7
    b = np.arange(10, dtype=np.float32).reshape(5, 2) - 4
    prepared = xrt._core.PreparedCall("matmul", [xrt.from_numpy(a), xrt.from_numpy(b)])
    assert prepared.outputs == [([3, 2], "float32")] and prepared.decision.kernel == "cpu"
    assert "matmul(float32[3,5],float32[5,2])" in prepared.signature
    out = np.zeros((3, 2), np.float32)
    prepared.launch([a.ctypes.data, b.ctypes.data], [out.ctypes.data])
    np.testing.assert_allclose(out, a @ b, rtol=1e-6)
    assert not prepared.accepts([a.ctypes.data + 4, b.ctypes.data])
    with pytest.raises(xrt.InvalidArgumentError, match="less aligned"):
        prepared.launch([a.ctypes.data + 4, b.ctypes.data], [out.ctypes.data])
    with pytest.raises(xrt.InvalidArgumentError, match="takes 2 input"):
        prepared.launch([a.ctypes.data], [out.ctypes.data])
