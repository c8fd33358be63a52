"""Registers the Pallas Mosaic TPU grouped matmul (forward and both backward products as kernels).

Validated only in Pallas' TPU interpret mode so far, so it ranks below the XLA path: on a TPU,
`platform="auto"` keeps XLA and `platform="pallas"` asks for these kernels.
"""

from ejkernel.kernels._pallas.tpu.grouped_matmul._interface import grouped_matmul_tpu
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("grouped_matmul", Platform.PALLAS, Backend.TPU, priority=-10)(grouped_matmul_tpu)
