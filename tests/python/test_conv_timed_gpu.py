"""Note [Convolutions are timed] (backends/cudnn/cudnn_conv.cpp): on a GPU, cuDNN's heuristic convolution is timed
against cudnn_search, the faster kept, and the decision says why (the channel counts where they are not multiples of 8,
as in an image model's 3-channel stem).
Note [Pools are timed] (backends/cudnn/cudnn_pool.cpp): cuDNN's pools are timed against cuda_raw's."""

import numpy as np

import xpuruntime as xrt
from conftest import requires_gpu


def conv(x, w, attrs):
    gpu = [xrt.from_numpy(a).to("cuda:0") for a in (x, w)]
    outputs, decision = xrt.ops.call("conv2d", gpu + [None, None], attrs, return_decision=True)
    want = xrt.ops.call("conv2d", [xrt.from_numpy(x.astype(np.float32)), xrt.from_numpy(w.astype(np.float32)), None,
                                   None], attrs)[0].numpy()
    got = outputs[0].cpu().numpy().astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))
    return decision


@requires_gpu
def test_a_three_channel_stem_is_timed_against_cudnns_search():
    rng = np.random.default_rng(42)
    for batch, size, kernel, outputs, stride in ((2, 64, 7, 64, 2), (3, 33, 3, 16, 2), (1, 17, 3, 24, 1)):
        x = rng.uniform(-1, 1, (batch, 3, size, size)).astype(np.float16)
        w = rng.uniform(-0.5, 0.5, (outputs, 3, kernel, kernel)).astype(np.float16)
        pad = kernel // 2
        decision = conv(x, w, {"pads": [pad] * 4, "strides": [stride, stride]})
        assert decision.rule == "autotuned", decision.reason
        assert "3 input and" in decision.reason and "not both multiples of 8" in decision.reason, decision.reason
        timed = {c["kernel"] for c in decision.candidates if c.get("time_us") is not None}
        assert {"cudnn", "cudnn_search"} <= timed and decision.kernel in timed, decision.candidates


@requires_gpu
def test_a_convolution_whose_channels_suit_is_timed_too():
    rng = np.random.default_rng(43)
    x = rng.uniform(-1, 1, (2, 16, 20, 20)).astype(np.float16)
    w = rng.uniform(-0.5, 0.5, (32, 16, 3, 3)).astype(np.float16)
    decision = conv(x, w, {"pads": [1, 1, 1, 1]})
    assert decision.rule == "autotuned" and "without running them" in decision.reason, decision.reason
    assert decision.kernel in ("cudnn", "cudnn_search"), decision.kernel


@requires_gpu
def test_a_max_pool_is_timed_against_the_own_kernel():
    rng = np.random.default_rng(44)
    x = rng.uniform(-1, 1, (2, 8, 15, 15)).astype(np.float16)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    outputs, decision = xrt.ops.call("max_pool2d", [xrt.from_numpy(x).to("cuda:0")], attrs, return_decision=True)
    want = xrt.ops.call("max_pool2d", [xrt.from_numpy(x.astype(np.float32))], attrs)[0].numpy()
    np.testing.assert_array_equal(outputs[0].cpu().numpy().astype(np.float32), want)
    assert decision.rule == "autotuned" and "cuDNN's pooling" in decision.reason, decision.reason
    timed = {c["kernel"] for c in decision.candidates if c.get("time_us") is not None}
    assert {"cudnn", "cuda_raw"} <= timed, decision.candidates
