"""The XLA ring attention (K/V blocks around a mesh axis, XLA flash attention per step)."""

from ejkernel.kernels._xla.ring_attention._interface import ring_attention_xla

__all__ = ["ring_attention_xla"]
