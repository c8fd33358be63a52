"""Registers the Pallas-Triton grouped matmul (forward and both backward products as kernels)."""

from ejkernel.kernels._triton.grouped_matmul._interface import grouped_matmul_triton
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("grouped_matmul", Platform.TRITON, Backend.GPU, priority=10)(grouped_matmul_triton)
