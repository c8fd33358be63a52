"""The cuDNN route of flash attention."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._cuda.flash_attention._interface import flash_attention_cudnn

flash_attention = public_defaults(flash_attention_cudnn)
"""The implementation the op declares: `flash_attention_cudnn` callable with the public function's defaults."""
