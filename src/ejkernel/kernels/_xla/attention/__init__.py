"""The dense XLA attention (returns the weights too)."""

from ejkernel.kernels._common.attention import keyword_defaults
from ejkernel.kernels._xla.attention._interface import attention_xla

attention = keyword_defaults(attention_xla)
"""The implementation the op declares: `attention_xla` callable with the public function's defaults."""
