"""`prefill_page_attention`: a chunk of one sequence's last queries over its pages, causally."""

import dataclasses

import numpy as np
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.paged_attention import (
    DEFAULT_MASK_VALUE,
    check_heads,
    check_mask_value,
    check_same_dtype,
    check_sequence_values,
    check_shape,
    check_soft_cap,
    last_positions_window,
    resolve_scale,
)
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.modules.operations.page_attention import PagedAttentionConfig, PagedAttentionKernel, busy_sequences


@dataclasses.dataclass(frozen=True)
class PrefillPageAttentionConfig(PagedAttentionConfig):
    """Tiling of `prefill_page_attention` (see `PagedAttentionConfig`)."""


class PrefillPageAttention(PagedAttentionKernel):
    op_id = "prefill_page_attention"
    config_type = PrefillPageAttentionConfig

    def busy_integers(self, args):
        _, key_cache, _, _, pages = args[:5]
        lengths, tables, _ = busy_sequences(1, pages.shape[0], key_cache.shape[2], key_cache.shape[1], 0)
        return {3: lengths, 4: tables[0]}


@typechecked
def prefill_page_attention(
    query: Float[Array, "chunk num_heads head_dim"],
    key_cache: Float[Array, "num_kv_heads num_pages page_size head_dim"],
    value_cache: Float[Array, "num_kv_heads num_pages page_size head_dim"],
    context_len: Int[Array, " 1"],
    page_indices: Int[Array, " pages_per_seq"],
    /,
    *,
    softmax_scale: float | None = None,
    mask_value: float = DEFAULT_MASK_VALUE,
    attn_logits_soft_cap: float | None = None,
    sliding_window: int | None = None,
    platform: str | None = None,
    cfg: PrefillPageAttentionConfig | None = None,
) -> Float[Array, "chunk num_heads head_dim"]:
    """Causal attention of the last `chunk` positions of one sequence over its pages.

    The sequence's `context_len[0]` keys live in pages `page_indices` (in order) of the caches
    `[Hkv, pages, page_size, D]`; query `i` sits at position `context_len - chunk + i`, so the chunk
    must not be longer than the context. `softmax_scale` defaults to `D**-0.5`; soft cap
    `c·tanh(s/c)`; `sliding_window=w` keeps the last `w` positions up to the query's own. Masked keys
    are excluded exactly (`mask_value` <= -1e4 acts as -inf).

    Index values: a bad one raises a ValueError outside `jit` (under `jit` too with `EJKERNEL_CHECKS=1`);
    otherwise under `jit`, `context_len` is clamped to `[0, pages_per_seq·page_size]` (queries it puts
    before position 0, when the chunk is longer, give zeros), and a `page_indices` entry it reaches
    outside `[0, num_pages)` holds no keys (its positions are masked).
    """
    chunk, num_heads, head_dim = query.shape
    num_kv_heads, num_pages, page_size, _ = key_cache.shape
    check_heads(num_heads, num_kv_heads)
    check_same_dtype("query, key_cache and value_cache", query, key_cache, value_cache)
    check_shape("value_cache", value_cache, key_cache.shape, "[kv_heads, pages, page_size, head_dim]")
    check_mask_value(mask_value)
    options = dict(
        softmax_scale=resolve_scale(softmax_scale, head_dim),
        attn_logits_soft_cap=check_soft_cap(attn_logits_soft_cap, "attn_logits_soft_cap"),
        sliding_window=sliding_window,
    )
    last_positions_window(sliding_window)
    check_sequence_values(
        page_tables=page_indices,
        kv_len=context_len,
        page_size=page_size,
        num_pages=num_pages,
        names={"page_tables": "page_indices", "kv_len": "context_len", "query_start_loc": "query"},
        query_start_loc=np.array([0, chunk]),
        num_tokens=chunk,
    )
    return executor(
        PrefillPageAttention(),
        query,
        key_cache,
        value_cache,
        context_len,
        page_indices,
        platform=platform,
        cfg=cfg,
        **options,
    )
