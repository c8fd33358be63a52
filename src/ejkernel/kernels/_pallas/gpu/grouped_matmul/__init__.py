"""Registers the Pallas Mosaic GPU (Hopper) grouped matmul: forward, dlhs and drhs as wgmma kernels.

Ranked below the Triton kernels (priority 5 against 10) until a GPU run shows it faster: on a GPU,
`platform="auto"` keeps Triton and `platform="pallas"` asks for these kernels.
"""

from ejkernel.kernels._pallas.gpu.grouped_matmul._interface import grouped_matmul_mosaic_gpu
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("grouped_matmul", Platform.PALLAS, Backend.GPU, priority=5)(grouped_matmul_mosaic_gpu)
