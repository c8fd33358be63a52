"""The XLA quantized matmul (row tiles dequantized one at a time, custom VJP)."""

from ejkernel.kernels._xla.quantized_matmul._interface import quantized_matmul_xla

__all__ = ["quantized_matmul_xla"]
