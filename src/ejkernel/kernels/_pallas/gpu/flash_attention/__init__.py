"""Registers the Pallas Mosaic GPU (Hopper) flash attention: forward, dQ and dK/dV kernels."""

from ejkernel.kernels._common.attention import public_defaults
from ejkernel.kernels._pallas.gpu.flash_attention._interface import flash_attention_mosaic_gpu
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("flash_attention", Platform.PALLAS, Backend.GPU, priority=20)(
    public_defaults(flash_attention_mosaic_gpu)
)
