"""Registers the Pallas-Triton Mamba-1 selective scan (chunk-parallel forward and backward kernels)."""

from ejkernel.kernels._triton.state_space_v1._interface import state_space_v1_triton
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("state_space_v1", Platform.TRITON, Backend.GPU, priority=10)(state_space_v1_triton)
