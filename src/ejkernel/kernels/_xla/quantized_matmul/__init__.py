"""Registers the XLA quantized matmul (row tiles dequantized one at a time, custom VJP)."""

from ejkernel.kernels._xla.quantized_matmul._interface import quantized_matmul_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("quantized_matmul", Platform.XLA, Backend.ANY, priority=0)(quantized_matmul_xla)
