"""Registers the Triton mean pooling."""

from ejkernel.kernels._triton.mean_pooling._interface import mean_pooling_triton
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("mean_pooling", Platform.TRITON, Backend.GPU, priority=10)(mean_pooling_triton)
