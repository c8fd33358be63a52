"""The cuDNN ring attention (cuDNN fused attention per step; GPU only)."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._cuda.ring_attention._interface import ring_attention_cudnn

ring_attention = public_defaults(ring_attention_cudnn, sinks_first=True)
"""The implementation the op declares: `ring_attention_cudnn` callable with upstream's keyword options."""

__all__ = ["ring_attention", "ring_attention_cudnn"]
