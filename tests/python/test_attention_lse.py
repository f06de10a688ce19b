"""The attention op's log-sum-exp output (return_lse=1) through xrt._core.ops_call / ops_plan: two outputs, lse
[B, H, Sq] float32 = log(sum_j exp(q k^T * scale + mask)) against NumPy, on CPU (and flash_v2 on a GPU)."""

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu


def reference(q, k, v, mask=None, causal=False, scale=0.0):
    """(y, lse) in float64: softmax(q k^T * scale + mask) v and the natural-log log-sum-exp of each score row."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = scale or 1.0 / np.sqrt(q.shape[-1])
    s = q @ k.transpose(0, 1, 3, 2) * scale
    if mask is not None:
        s = s + np.asarray(mask, np.float64)
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - m)
        total = e.sum(-1, keepdims=True)
        lse = np.where(np.isneginf(m), -np.inf, m + np.log(total))[..., 0]
        return (e / total) @ v, lse


def test_return_lse_gives_two_outputs_against_numpy():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 37, 24), np.float32)
    k = rng.standard_normal((2, 2, 53, 24), np.float32)  # GQA
    v = rng.standard_normal((2, 2, 53, 16), np.float32)
    mask = rng.uniform(-2, 2, (2, 1, 37, 53)).astype(np.float32)
    mask[0, 0, 3, :] = -np.inf  # a fully masked row: lse -inf, y NaN
    mask[1, 0, :, ::5] = -np.inf
    for causal in (0, 1):
        for m in (None, mask):
            attrs = {"causal": causal, "scale": 0.3, "return_lse": 1}
            outputs = xrt._core.ops_call("attention", [q, k, v, m], attrs)
            assert len(outputs) == 2
            y, lse = (np.from_dlpack(t) for t in outputs)
            want_y, want_lse = reference(q, k, v, m, causal, 0.3)
            assert lse.shape == (2, 4, 37) and lse.dtype == np.float32
            np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5)
            if m is not None:
                assert np.all(np.isneginf(lse[0, :, 3]))
            # Output 0 is what return_lse=0 gives.
            plain = xrt._core.ops_call("attention", [q, k, v, m], {"causal": causal, "scale": 0.3})
            assert len(plain) == 1
            np.testing.assert_array_equal(np.from_dlpack(plain[0]), y)


def test_return_lse_is_float32_for_16_bit_inputs_and_planned():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 9, 8)).astype(np.float16) for _ in range(3))
    _, outputs, _ = xrt._core.ops_plan("attention", [q, k, v, None], {"return_lse": 1})
    assert [(list(shape), dtype) for shape, dtype in outputs] == [([1, 2, 9, 8], "float16"), ([1, 2, 9], "float32")]
    _, outputs, _ = xrt._core.ops_plan("attention", [q, k, v, None], {})
    assert len(outputs) == 1
    y, lse = xrt._core.ops_call("attention", [q, k, v, None], {"return_lse": 1})
    assert y.dtype == "float16" and lse.dtype == "float32"
    _, want_lse = reference(q, k, v)
    np.testing.assert_allclose(np.from_dlpack(lse), want_lse, rtol=1e-5, atol=1e-5)


def test_return_lse_into_caller_allocated_outputs():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 5, 8), np.float32) for _ in range(3))
    y = np.zeros((1, 2, 5, 8), np.float32)
    lse = np.zeros((1, 2, 5), np.float32)
    xrt._core.ops_call("attention", [q, k, v, None], {"causal": 1, "return_lse": 1}, outputs=[y, lse])
    want_y, want_lse = reference(q, k, v, causal=True)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5)
    with pytest.raises(xrt.InvalidArgumentError, match="expected 2 output tensor"):
        xrt._core.ops_call("attention", [q, k, v, None], {"return_lse": 1}, outputs=[y])


def test_bad_return_lse_is_an_invalid_argument():
    q = np.ones((1, 1, 2, 4), np.float32)
    for bad in (2, -1):
        with pytest.raises(xrt.InvalidArgumentError, match=f"return_lse must be 0 or 1, got {bad}"):
            xrt._core.ops_call("attention", [q, q, q, None], {"return_lse": bad})


@requires_gpu
def test_flash_v2_lse_matches_cpu():
    rng = np.random.default_rng(3)
    q = rng.uniform(-2, 2, (2, 4, 200, 64)).astype(np.float16)
    k = rng.uniform(-2, 2, (2, 2, 77, 64)).astype(np.float16)
    v = rng.uniform(-1, 1, (2, 2, 77, 64)).astype(np.float16)
    gpu = [xrt.from_numpy(a).to("cuda:0") for a in (q, k, v)]
    for causal in (0, 1):
        attrs = {"causal": causal, "return_lse": 1}
        outputs, decision = xrt.ops.call("attention", gpu + [None], attrs,
                                         policy=xrt.KernelPolicy(attention="pin:flash_v2"), return_decision=True)
        assert decision.kernel == "flash_v2"
        lse = outputs[1].cpu().numpy()
        _, want = xrt._core.ops_call("attention", [q, k, v, None], attrs)
        np.testing.assert_allclose(lse, np.from_dlpack(want), rtol=1e-4, atol=1e-3)


@requires_gpu
def test_cudnn_ranks_first_on_large_attention_on_hopper():
    """Note [cuDNN attention ranks first on large problems]: on sm_90+, from 2^22 scores (B * H * Sq * Sk) the
    first-supported pick is cudnn and its reason says so; below it flash_v2, which asks to be timed against the others
    (Note [Timed attention]); a policy naming flash_v2 still gets it."""
    info = xrt.runtime.get_device_info("cuda:0")
    major, minor = info.compute_capability_major, info.compute_capability_minor
    rng = np.random.default_rng(5)

    def run(shape, policy=None):
        q, k, v = (rng.uniform(-1, 1, shape).astype(np.float16) for _ in range(3))
        gpu = [xrt.from_numpy(a).to("cuda:0") for a in (q, k, v)]
        outputs, decision = xrt.ops.call("attention", gpu + [None], {}, policy=policy, return_decision=True)
        want, _ = reference(q, k, v)
        np.testing.assert_allclose(outputs[0].cpu().numpy().astype(np.float32), want, atol=2e-3)
        return decision

    small = run((1, 4, 128, 64))  # 65536 scores: flash_v2 first, timed against cudnn and unfused
    assert small.rule == "autotuned" and "timed because flash_v2" in small.reason, small.reason
    timed = {c["kernel"] for c in small.candidates if c.get("time_us") is not None}
    assert "flash_v2" in timed and small.kernel in timed, small.candidates
    large = run((2, 8, 1024, 64))  # 16.8M scores
    cudnn = next(c for c in large.candidates if c["kernel"] == "cudnn")
    if not cudnn["supported"] or major * 10 + minor < 90:
        assert large.kernel == "flash_v2", large.reason
        pytest.skip(f"cudnn attention cannot run here or this is not sm_90+: {cudnn['reason']}")
    assert large.kernel == "cudnn"
    assert large.rule == "first-supported"
    assert "cudnn ranks first on sm_" in large.reason and "B*H*Sq*Sk = 16777216" in large.reason, large.reason
    pinned = run((2, 8, 1024, 64), xrt.KernelPolicy(attention="flash_v2"))
    assert pinned.kernel == "flash_v2"
