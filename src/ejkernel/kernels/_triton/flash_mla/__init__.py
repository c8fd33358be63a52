"""Registers the Pallas-Triton multi-head latent attention (absorbed forward kernel; XLA backward)."""

from ejkernel.kernels._triton.flash_mla._interface import flash_mla_triton
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("flash_mla", Platform.TRITON, Backend.GPU, priority=10)(flash_mla_triton)
