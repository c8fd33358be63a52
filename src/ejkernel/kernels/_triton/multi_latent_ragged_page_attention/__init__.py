"""The Pallas-Triton MLA serving implementation, declared for both ops (v2 differs only in its config)."""

from ejkernel.kernels._triton.multi_latent_ragged_page_attention._interface import (
    multi_latent_ragged_page_attention_triton,
)

__all__ = ["multi_latent_ragged_page_attention_triton"]
