"""The XLA MLA serving implementation, declared for both ops (v2 differs only in its config)."""

from ejkernel.kernels._xla.multi_latent_ragged_page_attention._interface import multi_latent_ragged_page_attention_xla

__all__ = ["multi_latent_ragged_page_attention_xla"]
