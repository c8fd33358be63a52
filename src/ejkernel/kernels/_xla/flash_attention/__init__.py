"""The XLA flash attention (chunked online softmax, custom VJP, every feature)."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._xla.flash_attention._interface import flash_attention_xla

flash_attention = public_defaults(flash_attention_xla)
"""The implementation the op declares: `flash_attention_xla` callable with the public function's defaults."""
