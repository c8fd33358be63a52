"""Registers the XLA multi-head latent attention (absorbed form over the XLA flash attention)."""

from ejkernel.kernels._xla.flash_mla._interface import flash_mla_xla
from ejkernel.registry import Backend, Platform, kernel_registry

kernel_registry.register("flash_mla", Platform.XLA, Backend.ANY, priority=0)(flash_mla_xla)
