"""The XLA multi-head latent attention (absorbed form over the XLA flash attention)."""

from ejkernel.kernels._xla.flash_mla._interface import flash_mla_xla

__all__ = ["flash_mla_xla"]
