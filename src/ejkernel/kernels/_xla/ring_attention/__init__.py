"""The XLA ring attention (K/V blocks around a mesh axis, XLA flash attention per step)."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._xla.ring_attention._interface import ring_attention_xla

ring_attention = public_defaults(ring_attention_xla, sinks_first=True)
"""The implementation the op declares: `ring_attention_xla` callable with upstream's keyword options."""

__all__ = ["ring_attention", "ring_attention_xla"]
