"""The Triton mean pooling."""

from ejkernel.kernels._triton.mean_pooling._interface import mean_pooling_triton

__all__ = ["mean_pooling_triton"]
