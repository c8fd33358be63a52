"""Registers the Pallas-Triton block-sparse attention (forward, dQ and dK/dV kernels over the block table)."""

from ejkernel.kernels._triton.blocksparse_attention._interface import blocksparse_attention_triton
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("blocksparse_attention", Platform.TRITON, Backend.GPU, priority=10)(
    blocksparse_attention_triton
)
