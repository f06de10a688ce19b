"""One kernel policy file from training to inference.

A small causal transformer is trained for a few hundred steps under a KernelPolicy file (xpuruntime.pytorch routes
its linear layers and attention to the kernels the file names: cuBLASLt and cuDNN's fused attention (xpuruntime's
`cudnn` kernel) on a GPU, xpuruntime's CPU kernels on the CPU), exported to ONNX, and run by InferenceSession's native engine under the same file. The two
explain reports are printed, then a table of the kernel each op used in training and in inference.

    .venv/bin/python examples/training_kernel_policy.py                 # GPU when there is one, else a short CPU run
    .venv/bin/python examples/training_kernel_policy.py --device cpu --steps 40

Needs PyTorch (the ``torch`` extra) and the onnx package (python3-onnx) for the inference half.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import xpuruntime as xrt
import xpuruntime.pytorch as xrt_torch

VOCAB, DIM, HEADS, LAYERS, SEQ = 64, 128, 2, 2, 32
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")  # PyTorch >= 2.0


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.q, self.k, self.v = (torch.nn.Linear(DIM, DIM) for _ in range(3))
        self.proj = torch.nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = torch.nn.Linear(DIM, 4 * DIM), torch.nn.Linear(4 * DIM, DIM)
        self.register_buffer("causal_mask", torch.full((SEQ, SEQ), float("-inf")).triu(1), persistent=False)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, export: bool) -> torch.Tensor:
        if not export and HAS_SDPA:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # The same function, written the way the native engine's attention_fusion pass recognizes it in ONNX
        # (MatMul(Q, Kᵀ) -> Mul(scale) -> Add(mask) -> Softmax -> MatMul(V)), so that it becomes one Attention op.
        s = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(DIM // HEADS)) + self.causal_mask[:s, :s]
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    def forward(self, x: torch.Tensor, export: bool = False) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.norm1(x)
        # Separate projections (not one qkv GEMM split in three): the exported graph then has no Split, and the
        # native engine knows every shape when it plans.
        q, k, v = (proj(h).view(b, s, HEADS, DIM // HEADS).transpose(1, 2) for proj in (self.q, self.k, self.v))
        x = x + self.proj(self.attention(q, k, v, export).transpose(1, 2).reshape(b, s, DIM))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.pos = torch.nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)
        self.export = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, self.export)
        return self.head(self.norm(x))


def batch(generator: torch.Generator, size: int, device: str) -> torch.Tensor:
    """Arithmetic sequences modulo VOCAB (random start and stride): the next token is learnable from the context."""
    start = torch.randint(0, VOCAB, (size, 1), generator=generator)
    stride = torch.randint(1, 8, (size, 1), generator=generator)
    return ((start + stride * torch.arange(SEQ + 1)) % VOCAB).to(device)


def export_onnx(model: torch.nn.Module, tokens: torch.Tensor, path: pathlib.Path) -> None:
    """torch.onnx.export with the TorchScript exporter where this PyTorch has the choice (opset 17: LayerNorm)."""
    kwargs = dict(input_names=["tokens"], output_names=["logits"], opset_version=17)
    try:
        torch.onnx.export(model, (tokens,), str(path), dynamo=False, **kwargs)
    except TypeError:  # PyTorch < 2.5: no `dynamo` argument
        torch.onnx.export(model, (tokens,), str(path), **kwargs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 300 on cuda, 60 on cpu)")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="folder for policy.json and model.onnx")
    args = parser.parse_args(argv)
    device = args.device
    cuda = device == "cuda"
    if cuda and xrt.get_device_count() == 0:
        print("xpuruntime sees no CUDA device; run with --device cpu", file=sys.stderr)
        return 1
    steps = args.steps or (300 if cuda else 60)
    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="xpuruntime_training_"))
    out.mkdir(parents=True, exist_ok=True)

    # 1. The policy file: the one artifact training and inference share.
    policy_path = out / "policy.json"
    if cuda:
        xrt.KernelPolicy(matmul="cublasLt", attention="cudnn").save(policy_path)
    else:
        xrt.KernelPolicy(matmul="cpu", attention="cpu").save(policy_path)
    precision = "bf16" if cuda else "fp32"
    print(f"policy file {policy_path}:\n{policy_path.read_text()}")

    # 2. Training under it.
    torch.manual_seed(0)
    model = TinyLM().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    generator = torch.Generator().manual_seed(0)
    scope = xrt_torch.set_kernel_policy(policy_path)
    for step in range(1, steps + 1):
        data = batch(generator, 32, device)
        with xrt_torch.autocast(precision, device_type=device):
            logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), data[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 1 or step % 50 == 0 or step == steps:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    model.eval()
    probe = batch(torch.Generator().manual_seed(1), 4, device)[:, :-1]
    with torch.no_grad(), xrt_torch.autocast(precision, device_type=device):
        trained_logits = model(probe).float()
    xrt_torch.set_kernel_policy(None)
    print("\n=== training: xpuruntime.pytorch decision log ===")
    print(scope.log.to_text(candidates=False))

    # 3. Export, then inference under the same file.
    model.export = True
    onnx_path = out / "model.onnx"
    export_onnx(model.float(), probe, onnx_path)
    session = xrt.InferenceSession(onnx_path, device="cuda:0" if cuda else "cpu", engine="native",
                                   kernel_policy=xrt.KernelPolicy.load(policy_path),
                                   exec_policy=xrt.ExecutionPolicy(precision=precision))
    result = session.run({"tokens": probe.cpu().numpy()})["logits"]
    served = torch.from_dlpack(result).float().cpu() if cuda else torch.from_numpy(np.asarray(result))
    print("=== inference: InferenceSession.explain() ===")
    print(session.explain())
    print()
    difference = (served - trained_logits.cpu()).abs().max().item()
    agree = (served.argmax(-1) == trained_logits.cpu().argmax(-1)).float().mean().item()
    print(f"logits: max |training - inference| = {difference:.3g}; same next-token choice {100 * agree:.1f}%")

    # 4. The kernels, side by side.
    training = scope.log.kernels("forward")
    inference: dict = {}
    for node in session.explain().nodes:
        if node["op"] in ("linear", "matmul", "attention"):
            inference.setdefault(node["op"], [])
            if node["kernel"] not in inference[node["op"]]:
                inference[node["op"]].append(node["kernel"])
    ops = sorted(set(training) | set(inference))
    if not HAS_SDPA:
        print(f"\nPyTorch {torch.__version__} has no scaled_dot_product_attention: training computed attention with "
              "plain matmuls, so only the linear layers are compared")
        ops = ["linear"]
    print("\nop         training (forward)   inference")
    same = True
    for op in ops:
        t, i = "/".join(training.get(op, ["-"])), "/".join(inference.get(op, ["-"]))
        same &= t == i
        print(f"{op:10s} {t:20s} {i}")
    print("same kernel choices in training and inference:", "yes" if same else "no")
    return 0 if same else 2


if __name__ == "__main__":
    sys.exit(main())
