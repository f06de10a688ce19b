"""KernelPolicy / ExecutionPolicy from Python: construction forms, validation messages, round trips."""

import json

import pytest

import xpuruntime as xrt
from conftest import requires_yaml


def sample():
    return xrt.KernelPolicy(matmul=["cublasLt", "cublas"], attention=xrt.pinned("flash_v2"),
                            softmax="auto:BestPerformance", conv="cudnn")


def test_forms_and_accessors():
    p = sample()
    assert p.get("attention") == "pin:flash_v2"
    assert p.get("matmul") == "[cublasLt, cublas]"
    assert p.get("relu") is None
    assert p.rules["matmul"] == {"mode": "preferred", "kernels": ["cublasLt", "cublas"]}
    assert p.rules["softmax"] == {"mode": "auto", "strategy": "BestPerformance"}
    assert p.preferences == {"attention": "pin:flash_v2", "conv": "cudnn", "matmul": "[cublasLt, cublas]",
                             "softmax": "auto:BestPerformance"}
    assert "matmul" in p and len(p) == 4
    assert repr(p) == ("KernelPolicy(attention=pin:flash_v2, conv=cudnn, matmul=[cublasLt, cublas], "
                       "softmax=auto:BestPerformance)")
    q = xrt.KernelPolicy({"matmul": {"mode": "preferred", "kernels": ["cublasLt", "cublas"]}},
                         attention={"mode": "pinned", "kernels": ["flash_v2"]}, conv="cudnn")
    q.auto("softmax", "BestPerformance")
    assert q == p
    assert q.fingerprint == p.fingerprint
    assert p.copy() == p and p.copy() is not p
    p.remove("conv").pin("linear", "cublas").prefer("gelu", "cuda_raw", "cpu")
    assert p.get("linear") == "pin:cublas" and p.get("gelu") == "[cuda_raw, cpu]" and p.get("conv") is None
    assert p != q


def test_validation_lists_valid_choices():
    with pytest.raises(xrt.InvalidArgumentError, match="unknown op 'matmull'.*valid ops and op families: .*matmul"):
        xrt.KernelPolicy(matmull="cublasLt")
    with pytest.raises(xrt.InvalidArgumentError, match=r"unknown kernel 'cublasLT' for 'matmul'.*valid kernels: .*cublasLt"):
        xrt.KernelPolicy(matmul="cublasLT")
    with pytest.raises(xrt.InvalidArgumentError, match="valid strategies: FirstSupported, BestPerformance"):
        xrt.KernelPolicy(auto_strategy="Fastest")
    with pytest.raises(xrt.InvalidArgumentError, match="valid modes: pinned, preferred, auto"):
        xrt.KernelPolicy(matmul={"mode": "always", "kernels": ["cpu"]})
    with pytest.raises(xrt.InvalidArgumentError, match="valid keys: kernels, mode, strategy"):
        xrt.KernelPolicy(matmul={"mode": "pinned", "kernel": "cpu"})
    with pytest.raises(xrt.InvalidTypeError):
        xrt.KernelPolicy(matmul=3)
    with pytest.raises(ValueError):  # InvalidArgumentError is also a ValueError
        xrt.KernelPolicy.from_json('{"rulez": {}}')
    with pytest.raises(xrt.InvalidArgumentError, match="valid precisions: fp32, tf32, fp16, bf16, int8"):
        xrt.ExecutionPolicy(precision="fp4")
    with pytest.raises(xrt.InvalidArgumentError, match="unknown ExecutionPolicy field 'precison'"):
        xrt.ExecutionPolicy(precison="fp16")
    with pytest.raises(xrt.InvalidArgumentError, match="must be True or False"):
        xrt.ExecutionPolicy(deterministic="yes")
    with pytest.raises(xrt.InvalidArgumentError, match="invalid byte size"):
        xrt.ExecutionPolicy(workspace_limit="lots")


def test_json_round_trip_is_byte_identical(tmp_path):
    p = sample()
    text = p.to_json()
    assert xrt.KernelPolicy.from_json(text).to_json() == text
    data = json.loads(text)
    assert data["schema"] == "xpuruntime.kernel_policy/1" and data["auto_strategy"] == "FirstSupported"
    assert list(data["rules"]) == sorted(data["rules"])
    p.save(tmp_path / "p.json")
    assert (tmp_path / "p.json").read_text() == text
    assert xrt.KernelPolicy.load(tmp_path / "p.json") == p
    e = xrt.ExecutionPolicy(precision="bf16", deterministic=True, workspace_limit="64MiB", intra_op_threads=2)
    e.save(tmp_path / "e.json")
    assert xrt.ExecutionPolicy.load(tmp_path / "e.json") == e
    assert xrt.ExecutionPolicy.load(tmp_path / "e.json").workspace_limit == 64 << 20
    assert (tmp_path / "e.json").read_text() == e.to_json()


@requires_yaml
def test_yaml_round_trip_is_byte_identical(tmp_path):
    p = sample()
    assert xrt.KernelPolicy.from_yaml(p.to_yaml()).to_yaml() == p.to_yaml()
    assert xrt.KernelPolicy.from_yaml(p.to_yaml()).to_json() == p.to_json()
    for name in ("p.yaml", "p.yml"):
        p.save(tmp_path / name)
        assert xrt.KernelPolicy.load(tmp_path / name) == p
    hand_written = "matmul: [cublasLt, cublas]\nattention: pin:flash_v2\nconv: cudnn\nsoftmax: auto:BestPerformance\n"
    assert xrt.KernelPolicy.from_yaml(hand_written) == p
    e = xrt.ExecutionPolicy(precision="tf32", cuda_graphs=False)
    assert xrt.ExecutionPolicy.from_yaml(e.to_yaml()) == e
    with pytest.raises(xrt.InvalidArgumentError, match="not valid YAML"):
        xrt.KernelPolicy.from_yaml("matmul: [cublasLt")


def test_errors_for_files(tmp_path):
    with pytest.raises(xrt.InvalidArgumentError, match="cannot open"):
        xrt.KernelPolicy.load(tmp_path / "missing.json")
    with pytest.raises(xrt.InvalidArgumentError, match=r"\.json, \.yaml or \.yml"):
        sample().save(tmp_path / "p.txt")
    bad = tmp_path / "bad.json"
    bad.write_text('{"matmul": "nope"}')
    with pytest.raises(xrt.InvalidArgumentError, match=f"{bad}: unknown kernel 'nope'"):
        xrt.KernelPolicy.load(bad)


def test_execution_policy_fields():
    e = xrt.ExecutionPolicy()
    assert e.to_dict() == {"precision": "fp32", "deterministic": False, "cuda_graphs": True, "static_shape": False,
                           "workspace_limit": 0, "memory_limit": 0, "intra_op_threads": 0, "allow_spinning": True,
                           "fallback": "error", "tensor_parallel": 1, "allow_newer_opsets": False,
                           "fp8_fast_accumulation": False}
    e.memory_limit = "1GiB"
    assert e.memory_limit == 1 << 30
    assert "precision=fp32" in repr(e)
