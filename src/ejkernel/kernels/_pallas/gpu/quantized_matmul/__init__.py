"""The Pallas Mosaic GPU (Hopper) weight-only quantized matmul for decoding: swap-AB wgmma on TMA-fed codes."""

from ejkernel.kernels._pallas.gpu.quantized_matmul._interface import quantized_matmul_mosaic_gpu

__all__ = ["quantized_matmul_mosaic_gpu"]
