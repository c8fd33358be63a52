"""The Pallas Mosaic TPU block-sparse attention (checked in TPU interpret mode off TPU)."""

from ejkernel.kernels._pallas.tpu.blocksparse_attention._interface import blocksparse_attention_tpu

__all__ = ["blocksparse_attention_tpu"]
