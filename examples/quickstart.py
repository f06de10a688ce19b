"""xpuruntime quick start: an ONNX model through InferenceSession, the explanation of what ran (ONNX Runtime and
xpuruntime's native engine), and the same network through the functional ops under an explicit kernel policy.

    .venv/bin/python examples/quickstart.py

The model, examples/models/tiny_classifier.onnx, ships with the repository (examples/models/make_models.py
re-creates it): x[batch, 8] -> Gemm -> Relu -> Gemm -> Softmax -> probs[batch, 4].
"""

import pathlib

import numpy as np

import onnx_weights
import xpuruntime as xrt

MODEL = pathlib.Path(__file__).resolve().parent / "models" / "tiny_classifier.onnx"


def main() -> None:
    print(f"xpuruntime {xrt.__version__}; devices: {xrt.get_all_devices()}")
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)

    # 1. The model through InferenceSession ("auto" picks the engine and says why).
    session = xrt.InferenceSession(MODEL, device="cpu", engine="auto",
                                   exec_policy=xrt.ExecutionPolicy(intra_op_threads=1))
    print("\ninputs:", session.get_inputs(), "outputs:", session.get_outputs())
    outputs = session.run({"x": x})
    print("probs =\n", np.array2string(outputs["probs"], precision=4))
    print("\n" + str(session.explain()))

    # 2. The native engine: graph passes fused Gemm + Relu into one Linear; every node's kernel, why, and the memory
    #    plan (on a GPU, device="cuda:0" also captures the plan into a CUDA graph and replays it).
    native = xrt.InferenceSession(MODEL, device="cpu", engine="native")
    native_probs = native.run({"x": x})["probs"]
    if session.engine == "onnxruntime":
        print("native engine agrees with onnxruntime:", np.allclose(native_probs, outputs["probs"], atol=1e-5))
    else:  # a build without ONNX Runtime: "auto" ran the native engine above, so there is nothing to compare with
        why = xrt.unavailable_engines().get("onnxruntime", f"auto picked {session.engine}")
        print(f"onnxruntime was not available, so the native engine was not compared with it ({why})")
    print(native.explain())

    # 3. The same network with xpuruntime's own kernels, each op dispatched under an explicit policy.
    w = onnx_weights.load(MODEL)  # the model's initializers, read with numpy alone
    policy = xrt.KernelPolicy(matmul=["cublasLt", "cpu"], softmax="auto")
    h = xrt.ops.linear(x, w["w1"], w["b1"], "relu", weight_layout="kn", policy=policy)
    logits = xrt.ops.linear(h, w["w2"], w["b2"], weight_layout="kn", policy=policy)
    probs, decision = xrt.ops.softmax(logits, policy=policy, return_decision=True)
    print("functional ops agree with the session:", np.allclose(probs.numpy(), outputs["probs"], atol=1e-5))
    for d in xrt.ops.decisions(policy):
        print(" ", d)


if __name__ == "__main__":
    main()
