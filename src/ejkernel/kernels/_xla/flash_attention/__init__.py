"""The XLA flash attention (chunked online softmax, custom VJP, every feature): its core lives in
`kernels/_common/flash_attention/`, shared with the platforms that differentiate through it."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._common.flash_attention.entry import flash_attention_xla

flash_attention = public_defaults(flash_attention_xla)
"""The implementation the op declares: `flash_attention_xla` callable with the public function's defaults."""
