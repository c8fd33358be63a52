"""The Pallas-Triton quantized matmul (weight-only decode: packed weights decoded in registers)."""

from ejkernel.kernels._triton.quantized_matmul._interface import quantized_matmul_triton

__all__ = ["quantized_matmul_triton"]
