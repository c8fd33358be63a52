"""Registers the cuDNN route of flash attention (highest priority where cuDNN can serve the call)."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._cuda.flash_attention._interface import flash_attention_cudnn
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("flash_attention", Platform.CUDA, Backend.GPU, priority=30)(
    public_defaults(flash_attention_cudnn)
)
