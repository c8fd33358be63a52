"""The Pallas-Triton block-sparse attention (forward, dQ and dK/dV kernels over the block table)."""

from ejkernel.kernels._triton.blocksparse_attention._interface import blocksparse_attention_triton

__all__ = ["blocksparse_attention_triton"]
