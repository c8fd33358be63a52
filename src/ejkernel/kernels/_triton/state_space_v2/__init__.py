"""Registers the Pallas-Triton Mamba-2 SSD scan (the GLA kernels of the linear-attention family)."""

from ejkernel.kernels._triton.state_space_v2._interface import state_space_v2_triton
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("state_space_v2", Platform.TRITON, Backend.GPU, priority=10)(state_space_v2_triton)
