"""Registers the Pallas Mosaic TPU flash attention (forward and backward kernels)."""

from ejkernel.kernels._pallas.tpu.flash_attention._interface import flash_attention_tpu
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("flash_attention", Platform.PALLAS, Backend.TPU, priority=20)(flash_attention_tpu)
