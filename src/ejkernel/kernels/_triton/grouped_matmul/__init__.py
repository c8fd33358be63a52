"""The Pallas-Triton grouped matmul (forward and both backward products as kernels)."""

from ejkernel.kernels._triton.grouped_matmul._interface import grouped_matmul_triton

__all__ = ["grouped_matmul_triton"]
