"""The Pallas-Triton ring attention (our Triton flash attention kernels per step; GPU)."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._triton.ring_attention._interface import ring_attention_triton

ring_attention = public_defaults(ring_attention_triton, sinks_first=True)
"""The implementation the op declares: `ring_attention_triton` callable with upstream's keyword options."""

__all__ = ["ring_attention", "ring_attention_triton"]
