"""The Pallas-Triton flash attention (forward and backward kernels)."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._triton.flash_attention._interface import flash_attention_triton

flash_attention = public_defaults(flash_attention_triton)
"""The implementation the op declares: `flash_attention_triton` callable with the public function's defaults."""
