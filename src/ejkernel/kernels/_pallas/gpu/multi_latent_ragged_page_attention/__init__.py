"""The Pallas Mosaic GPU (Hopper) MLA serving implementation, declared for both ops (v2 differs only in its config)."""

from ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention._interface import (
    multi_latent_ragged_page_attention_mosaic_gpu,
)

__all__ = ["multi_latent_ragged_page_attention_mosaic_gpu"]
