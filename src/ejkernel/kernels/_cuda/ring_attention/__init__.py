"""The cuDNN ring attention (cuDNN fused attention per step; GPU only)."""

from ejkernel.kernels._cuda.ring_attention._interface import ring_attention_cudnn

__all__ = ["ring_attention_cudnn"]
