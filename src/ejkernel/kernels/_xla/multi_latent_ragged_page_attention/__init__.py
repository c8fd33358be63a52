"""Registers the XLA MLA serving implementation under both ops' names (v2 differs only in its config)."""

from ejkernel.kernels._xla.multi_latent_ragged_page_attention._interface import multi_latent_ragged_page_attention_xla
from ejkernel.registry import Backend, Platform, kernel_registry

for _algorithm in ("multi_latent_ragged_page_attention", "multi_latent_ragged_page_attention_v2"):
    kernel_registry.register(_algorithm, Platform.XLA, Backend.ANY, priority=0)(multi_latent_ragged_page_attention_xla)
