"""The Pallas Mosaic GPU (Hopper) block-sparse attention: flash attention's forward, dQ and dK/dV (or fused
backward) kernels walking the block table."""

from ejkernel.kernels._pallas.gpu.blocksparse_attention._interface import blocksparse_attention_mosaic_gpu

__all__ = ["blocksparse_attention_mosaic_gpu"]
