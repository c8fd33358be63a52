"""Registers the Triton mean pooling."""

from ejkernel.kernels._triton.mean_pooling._interface import mean_pooling_triton
from ejkernel.registry import Backend, Platform, kernel_registry

# Below XLA: on an H200, XLA's fused reduction read at 4.0 TB/s against this kernel's 3.75 (BENCHMARKS.md),
# so `platform="auto"` takes XLA; the kernel stays reachable with `platform="triton"`.
kernel_registry.register("mean_pooling", Platform.TRITON, Backend.GPU, priority=-10)(mean_pooling_triton)
