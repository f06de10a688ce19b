"""Inference: :class:`InferenceSession` runs ONNX models through an engine and explains what ran."""

from .session import InferenceSession

__all__ = ["InferenceSession"]
