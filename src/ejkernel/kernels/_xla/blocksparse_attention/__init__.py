"""Registers the XLA block-sparse attention (block table walked by a gathered-block core, custom VJP)."""

from ejkernel.kernels._xla.blocksparse_attention._interface import blocksparse_attention_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("blocksparse_attention", Platform.XLA, Backend.ANY, priority=0)(blocksparse_attention_xla)
