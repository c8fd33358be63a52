"""Registers the Pallas-Triton implementation of the six serving ops: one kernel behind six signatures.

Above XLA (priority 10): on a GPU `platform="auto"` takes the kernel, which declines (dtype, head dim)
what it cannot serve, and XLA serves the rest.
"""

from ejkernel.kernels._common.paged_attention.implementations import ADAPTERS, implementation
from ejkernel.kernels._triton.paged_attention._interface import paged_attention_triton_core
from ejkernel.registry import Backend, Platform, kernel_registry

for _algorithm in ADAPTERS:
    kernel_registry.register(_algorithm, Platform.TRITON, Backend.GPU, priority=10)(
        implementation(_algorithm, paged_attention_triton_core, f"{_algorithm}_triton")
    )
