"""The XLA grouped matmul (tile-schedule loop, custom VJP)."""

from ejkernel.kernels._xla.grouped_matmul._interface import grouped_matmul_xla

__all__ = ["grouped_matmul_xla"]
