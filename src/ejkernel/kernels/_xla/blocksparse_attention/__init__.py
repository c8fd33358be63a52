"""The XLA block-sparse attention (block table walked by a gathered-block core, custom VJP)."""

from ejkernel.kernels._xla.blocksparse_attention._interface import blocksparse_attention_xla

__all__ = ["blocksparse_attention_xla"]
