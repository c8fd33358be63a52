"""The Pallas Mosaic GPU (Hopper) serving ops: prefill chunks in flash attention tiles over the paged cache,
short sequences on the Triton core (`_interface`). Declared for `ragged_page_attention_v3` and
`unified_attention`, the ops of mixed serving batches."""

from ejkernel.kernels._common.paged_attention.implementations import implementation
from ejkernel.kernels._pallas.gpu.paged_attention._interface import paged_attention_mosaic_gpu_core

ragged_page_attention_v3 = implementation(
    "ragged_page_attention_v3", paged_attention_mosaic_gpu_core, "ragged_page_attention_v3_mosaic_gpu"
)
unified_attention = implementation("unified_attention", paged_attention_mosaic_gpu_core, "unified_attention_mosaic_gpu")

__all__ = ["paged_attention_mosaic_gpu_core", "ragged_page_attention_v3", "unified_attention"]
