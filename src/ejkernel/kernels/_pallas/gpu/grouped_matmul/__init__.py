"""The Pallas Mosaic GPU (Hopper) grouped matmul: forward, dlhs and drhs as wgmma kernels."""

from ejkernel.kernels._pallas.gpu.grouped_matmul._interface import grouped_matmul_mosaic_gpu

__all__ = ["grouped_matmul_mosaic_gpu"]
