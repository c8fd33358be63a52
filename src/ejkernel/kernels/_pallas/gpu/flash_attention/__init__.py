"""The Pallas Mosaic GPU (Hopper) flash attention: forward, dQ and dK/dV kernels."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._pallas.gpu.flash_attention._interface import flash_attention_mosaic_gpu

flash_attention = public_defaults(flash_attention_mosaic_gpu)
"""The implementation the op declares: `flash_attention_mosaic_gpu` callable with the public function's defaults."""
