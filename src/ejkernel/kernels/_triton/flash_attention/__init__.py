"""Registers the Pallas-Triton flash attention (forward and backward kernels)."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._triton.flash_attention._interface import flash_attention_triton
from ejkernel.registry import Backend, Platform, kernel_registry

register = kernel_registry.register("flash_attention", Platform.TRITON, Backend.GPU, priority=10)
register(public_defaults(flash_attention_triton))
