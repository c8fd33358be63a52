"""The Pallas-Triton implementation of the six serving ops: one kernel behind six signatures.

The kernel declines (dtype, head dim) what it cannot serve, and XLA serves the rest. `short_sequences_triton`,
its short-sequence pass alone, serves the decode rows beside the Mosaic GPU prefill tiles
(`_pallas/gpu/paged_attention`).
"""

from ejkernel.kernels._common.paged_attention.implementations import implementation
from ejkernel.kernels._triton.paged_attention._interface import (
    paged_attention_triton_core,
    short_queries,
    short_sequences_triton,
)

page_attention = implementation("page_attention", paged_attention_triton_core, "page_attention_triton")
prefill_page_attention = implementation(
    "prefill_page_attention", paged_attention_triton_core, "prefill_page_attention_triton"
)
ragged_page_attention_v2 = implementation(
    "ragged_page_attention_v2", paged_attention_triton_core, "ragged_page_attention_v2_triton"
)
ragged_page_attention_v3 = implementation(
    "ragged_page_attention_v3", paged_attention_triton_core, "ragged_page_attention_v3_triton"
)
ragged_decode_attention = implementation(
    "ragged_decode_attention", paged_attention_triton_core, "ragged_decode_attention_triton"
)
unified_attention = implementation("unified_attention", paged_attention_triton_core, "unified_attention_triton")

__all__ = [
    "page_attention",
    "prefill_page_attention",
    "ragged_decode_attention",
    "ragged_page_attention_v2",
    "ragged_page_attention_v3",
    "short_queries",
    "short_sequences_triton",
    "unified_attention",
]
