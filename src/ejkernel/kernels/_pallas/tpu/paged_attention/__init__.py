"""The Pallas Mosaic TPU kernel for `page_attention` and `ragged_page_attention_v3` (checked in TPU
interpret mode so far)."""

from ejkernel.kernels._common.paged_attention.implementations import implementation
from ejkernel.kernels._pallas.tpu.paged_attention._interface import paged_attention_tpu_core

page_attention = implementation("page_attention", paged_attention_tpu_core, "page_attention_tpu")
ragged_page_attention_v3 = implementation(
    "ragged_page_attention_v3", paged_attention_tpu_core, "ragged_page_attention_v3_tpu"
)
