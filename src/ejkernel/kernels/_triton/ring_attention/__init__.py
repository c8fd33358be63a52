"""Registers the Pallas-Triton ring attention (our Triton flash attention kernels per step; GPU)."""

from ejkernel.kernels._triton.ring_attention._interface import ring_attention_triton
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("ring_attention", Platform.TRITON, Backend.GPU, priority=10)(ring_attention_triton)
