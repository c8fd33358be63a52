"""The XLA mean pooling."""

from ejkernel.kernels._xla.mean_pooling._interface import mean_pooling_xla

__all__ = ["mean_pooling_xla"]
