"""Registers the XLA flash attention (chunked online softmax, custom VJP, every feature)."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._xla.flash_attention._interface import flash_attention_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("flash_attention", Platform.XLA, Backend.ANY, priority=0)(public_defaults(flash_attention_xla))
