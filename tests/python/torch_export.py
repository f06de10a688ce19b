"""ONNX export of a small torch model for the xpuruntime.pytorch tests (one exporter call across PyTorch versions)."""


def export_onnx(model, x, path) -> None:
    """Exports ``model(x)`` to ``path`` with input "x" and output "y" at opset 17, through the TorchScript exporter
    (PyTorch >= 2.9 defaults to the dynamo one, which needs onnxscript)."""
    import torch

    kwargs = dict(input_names=["x"], output_names=["y"], opset_version=17)
    try:
        torch.onnx.export(model, (x,), str(path), dynamo=False, **kwargs)
    except TypeError:  # PyTorch < 2.5: no `dynamo` argument
        torch.onnx.export(model, (x,), str(path), **kwargs)
