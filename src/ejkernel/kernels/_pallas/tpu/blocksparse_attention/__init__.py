"""Registers the Pallas Mosaic TPU block-sparse attention (checked in TPU interpret mode off TPU)."""

from ejkernel.kernels._pallas.tpu.blocksparse_attention._interface import blocksparse_attention_tpu
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("blocksparse_attention", Platform.PALLAS, Backend.TPU, priority=10)(blocksparse_attention_tpu)
