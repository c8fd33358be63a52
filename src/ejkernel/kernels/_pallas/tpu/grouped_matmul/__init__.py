"""The Pallas Mosaic TPU grouped matmul (forward and both backward products as kernels; checked in TPU
interpret mode so far)."""

from ejkernel.kernels._pallas.tpu.grouped_matmul._interface import grouped_matmul_tpu

__all__ = ["grouped_matmul_tpu"]
