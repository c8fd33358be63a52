"""The XLA implementation of the six serving ops: one plain-JAX core behind six signatures."""

from ejkernel.kernels._common.paged_attention.implementations import implementation
from ejkernel.kernels._common.paged_attention.jax_core import paged_attention_core

page_attention = implementation("page_attention", paged_attention_core, "page_attention_xla")
prefill_page_attention = implementation("prefill_page_attention", paged_attention_core, "prefill_page_attention_xla")
ragged_page_attention_v2 = implementation(
    "ragged_page_attention_v2", paged_attention_core, "ragged_page_attention_v2_xla"
)
ragged_page_attention_v3 = implementation(
    "ragged_page_attention_v3", paged_attention_core, "ragged_page_attention_v3_xla"
)
ragged_decode_attention = implementation("ragged_decode_attention", paged_attention_core, "ragged_decode_attention_xla")
unified_attention = implementation("unified_attention", paged_attention_core, "unified_attention_xla")
