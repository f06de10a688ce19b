"""Inference: :class:`InferenceSession` runs ONNX models through an engine and explains what ran."""

from .session import InferenceSession, IOBinding

__all__ = ["InferenceSession", "IOBinding"]
