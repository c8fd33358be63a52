"""The Pallas-Triton ring attention (our Triton flash attention kernels per step; GPU)."""

from ejkernel.kernels._triton.ring_attention._interface import ring_attention_triton

__all__ = ["ring_attention_triton"]
