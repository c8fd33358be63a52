"""The Mosaic GPU ring attention (our Hopper flash attention kernels per step; GPU only)."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._pallas.gpu.ring_attention._interface import ring_attention_mosaic_gpu

ring_attention = public_defaults(ring_attention_mosaic_gpu, sinks_first=True)
"""The implementation the op declares: `ring_attention_mosaic_gpu` callable with upstream's keyword options."""

__all__ = ["ring_attention", "ring_attention_mosaic_gpu"]
