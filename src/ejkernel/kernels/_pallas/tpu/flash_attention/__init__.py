"""The Pallas Mosaic TPU flash attention (forward and backward kernels; checked in TPU interpret mode so far)."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._pallas.tpu.flash_attention._interface import flash_attention_tpu

flash_attention = public_defaults(flash_attention_tpu)
"""The implementation the op declares: `flash_attention_tpu` callable with the public function's defaults."""
