"""Registers the XLA implementation of the six serving ops: one plain-JAX core behind six signatures."""

from ejkernel.kernels._common.paged_attention.implementations import ADAPTERS, implementation
from ejkernel.kernels._common.paged_attention.jax_core import paged_attention_core
from ejkernel.registry import Backend, Platform, kernel_registry

for _algorithm in ADAPTERS:
    kernel_registry.register(_algorithm, Platform.XLA, Backend.ANY, priority=0)(
        implementation(_algorithm, paged_attention_core, f"{_algorithm}_xla")
    )
