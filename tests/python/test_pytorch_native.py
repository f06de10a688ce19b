"""xpuruntime.pytorch's native path (Note [The native path] in src/cpp/bindings/torch/routing_native.cpp): calls it
serves give the values, gradients and decision log of the Python path; calls it cannot serve go to Python; it can
be turned off. Needs torch and a C++ compiler with PyTorch's headers (Debian: libtorch-dev); skips otherwise. The
CUDA side is in test_pytorch_gpu.py."""

import contextlib

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.fixture
def xrt_torch():
    import xpuruntime.pytorch as xrt_torch

    status = xrt_torch.set_native(True)
    if not status["loaded"]:
        pytest.skip(f"the native path is not available here: {status['reason']}")
    yield xrt_torch
    xrt_torch.set_kernel_policy(None)
    xrt_torch.set_native(True)


@pytest.fixture
def python_calls(monkeypatch):
    """How many calls the Python path's call sites and the Python linear backward served."""
    from xpuruntime.pytorch import _fast, _native

    counts = {"site": 0, "backward": 0}
    for cls in (_fast.Site, _fast.TorchSite):
        original = cls.__call__

        def counted(self, *args, _original=original):
            counts["site"] += 1
            return _original(self, *args)

        monkeypatch.setattr(cls, "__call__", counted)
    backward = _native._linear_backward

    def counted_backward(*args):
        counts["backward"] += 1
        return backward(*args)

    monkeypatch.setattr(_native, "_linear_backward", counted_backward)
    return counts


def _linear_steps(xrt_torch, steps, shape=(2, 5, 12), bias=True, seed=0):
    """Outputs and gradients of `steps` routed linear steps with fresh inputs, and PyTorch's own for the same."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(7, shape[-1], generator=gen, requires_grad=True)
    b = torch.randn(7, generator=gen, requires_grad=True) if bias else None
    params = [weight] + ([b] if bias else [])
    got, want = [], []
    for _ in range(steps):
        x = torch.randn(*shape, generator=gen, requires_grad=True)
        for store, routed in ((got, True), (want, False)):
            with (contextlib.nullcontext() if routed else xrt_torch.set_kernel_policy(None)):
                y = F.linear(x, weight, b)
                y.pow(3).sum().backward()
            store.append([y.detach()] + [t.grad.clone() for t in [x] + params])
            for t in [x] + params:
                t.grad = None
    return got, want


def test_native_status_says_whether_routed_calls_take_it(xrt_torch):
    status = xrt_torch.native_status()
    assert set(status) >= {"enabled", "loaded", "active", "cuda", "reason", "path"}
    assert status["enabled"] and status["loaded"] and status["active"] and status["path"].endswith(".so")
    off = xrt_torch.set_native(False)
    assert off["loaded"] and not off["enabled"] and not off["active"]


@pytest.mark.parametrize("shape,bias", [((2, 5, 12), True), ((9, 33), False), ((1, 1, 3), True)])
def test_native_linear_steps_match_pytorch_and_count_in_the_log(xrt_torch, python_calls, shape, bias):
    scope = xrt_torch.set_kernel_policy(matmul="pin:cpu")
    got, want = _linear_steps(xrt_torch, 4, shape, bias)
    for g_step, w_step in zip(got, want):
        for g, w in zip(g_step, w_step):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    # The first call and the first backward ran in Python (deciding); the three after them natively.
    assert python_calls["site"] == 1 and python_calls["backward"] == 1
    records = {r["node"]: r for r in scope.log.records}
    assert records["linear#0"]["calls"] == 4 and records["linear#0"]["kernel"] == "cpu"
    assert records["matmul#0 (backward: grad input)"]["calls"] == 4
    assert records["linear_grad_weight#0 (backward: grad weight)"]["calls"] == 4


def test_native_matmul_without_grad_and_unrouted_calls(xrt_torch, python_calls):
    gen = torch.Generator().manual_seed(1)
    scope = xrt_torch.set_kernel_policy(matmul="pin:cpu")
    for _ in range(3):
        a, b = torch.randn(3, 6, 5, generator=gen), torch.randn(3, 5, 4, generator=gen)
        c, d = torch.randn(13, 7, generator=gen), torch.randn(7, 2, generator=gen)
        with xrt_torch.set_kernel_policy(None):
            want = [torch.bmm(a.double(), b.double()).float(), (c.double() @ d.double()).float()]
        with torch.no_grad():
            torch.testing.assert_close(torch.matmul(a, b), want[0])
            torch.testing.assert_close(c @ d, want[1])
    assert python_calls["site"] == 2  # one first call per signature
    assert [r["calls"] for r in scope.log.records] == [3, 3]
    xrt_torch.set_kernel_policy(attention="cpu")  # no rule for linear: PyTorch's dispatch, logged per call
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    want = torch.mm(x.double(), w.double().t()).float()
    for _ in range(3):
        torch.testing.assert_close(F.linear(x, w), want)
    records = [r for r in xrt_torch.decision_log().records if r["op"] == "linear"]
    assert len(records) == 1 and records[0]["rule"] == "unrouted" and records[0]["calls"] == 3
    assert python_calls["site"] == 2  # the first call logs and runs without a site object; then native
    served = xrt_torch.native_status()["calls"]["served"]
    bias = torch.randn(4)
    for _ in range(3):  # keyword arguments: PyTorch runs the call as it is, so its native site takes them too
        torch.testing.assert_close(F.linear(x, w, bias=bias), want + bias)
    assert xrt_torch.native_status()["calls"]["served"] - served == 2
    records = [r for r in xrt_torch.decision_log().records if r["op"] == "linear"]
    assert sum(r["calls"] for r in records) == 6


def test_calls_the_native_path_cannot_serve_go_to_python(xrt_torch, python_calls):
    gen = torch.Generator().manual_seed(2)
    scope = xrt_torch.set_kernel_policy(matmul="pin:cpu")
    x, w, b = torch.randn(4, 8, generator=gen), torch.randn(3, 8, generator=gen), torch.randn(3, generator=gen)
    with xrt_torch.set_kernel_policy(None):
        want = x @ w.t() + b
    storage = torch.randn(1 + 4 * 8, generator=gen)
    misaligned = storage[1:].view(4, 8)
    assert misaligned.data_ptr() % 16 != 0
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(F.linear(x, w, bias=b), want)          # keyword arguments
            torch.testing.assert_close(F.linear(x.t().contiguous().t(), w, b), want)  # same strides: native
        for _ in range(2):
            F.linear(misaligned, w, b)                                          # copied first, by Python
        served_by_python = python_calls["site"]
        F.linear(misaligned, w, b)
        assert python_calls["site"] == served_by_python + 1
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = F.linear(x, w, b)
            y2 = F.linear(x, w, b)
        assert y.dtype == y2.dtype == torch.bfloat16
        torch.testing.assert_close(y2.float(), want, rtol=3e-2, atol=3e-2)
    total = sum(r["calls"] for r in scope.log.records)
    assert total == 2 + 2 + 3 + 2


def test_create_graph_backward_after_native_backwards(xrt_torch, python_calls):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(2, 5, dtype=torch.float64, generator=gen, requires_grad=True)

    def second():
        (gx,) = torch.autograd.grad(F.linear(x, w).pow(2).sum(), x, create_graph=True)
        return torch.autograd.grad(gx.sum(), w)[0]

    want = second()
    xrt_torch.set_kernel_policy(matmul="pin:cpu")
    for _ in range(2):  # the site's backward learns its routes and then runs natively
        F.linear(x, w).sum().backward()
    x.grad = w.grad = None
    torch.testing.assert_close(second(), want)
    assert python_calls["backward"] == 2  # the learning one and the create_graph one


def test_turning_the_native_path_off_routes_on_python(xrt_torch, python_calls):
    xrt_torch.set_native(False)
    xrt_torch.set_kernel_policy(matmul="pin:cpu")
    a, b = torch.randn(4, 6), torch.randn(6, 2)
    with xrt_torch.set_kernel_policy(None):
        want = (a.double() @ b.double()).float()
    for _ in range(3):
        torch.testing.assert_close(a @ b, want)
    assert python_calls["site"] == 3
    xrt_torch.set_native(True)
    for _ in range(3):
        a @ b
    assert python_calls["site"] == 4  # the site already existed in Python; the native one is made on its next call
    assert xrt_torch.decision_log().records[0]["calls"] == 6
