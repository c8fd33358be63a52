"""Each serving op's arguments (its full signature, public defaults) -> the one `PagedBatch` every core reads.

Every index value gets one meaning here, in every core (the adapters clamp, the cores mask):

- a key length is clamped to `[0, capacity]` (the table's positions, or the op's bound), a first key
  to `[0, length]`; queries keep the positions `kv_len - q_len + j`, so queries before position 0
  (more queries than keys) see no key causally and give zeros;
- query bounds are clamped to `[0, T]` and made non-decreasing (`ragged_queries`); the sequence
  count to `[0, N]`; tokens of no sequence give zeros;
- a position whose page-table entry is not a page of the cache holds no key (masked, it adds
  nothing), and a new token is not written there (`kv_cache.new_token_rows`).

A quantised cache (float8 or int8) may come with per-token-head scales: an array of the cache's shape without
its head-dim axis, flattened here to `[rows]` beside the rows view (`key_scales`, `value_scales`), so every
core addresses a row's scale as it addresses the row.

Options that only steer a schedule (split counts, TPU hints) or ask for the exact masking these ops
always do (`mask_value`) are accepted and dropped here; the cores read their tiling from `cfg`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.attention import fold_sinks
from ejkernel.kernels._common.paged_attention.arguments import (
    DEFAULT_MASK_VALUE,
    check_soft_cap,
    decode_window,
    last_positions_window,
    resolve_scale,
)
from ejkernel.kernels._common.paged_attention.kv_cache import (
    quantize_queries,
    rope_column,
    write_kv_cache,
    write_latents,
)
from ejkernel.kernels._common.paged_attention.problem import CacheRows, PagedBatch, PagedStatic


def _rows_view(cache) -> jax.Array:
    """A cache of any layout whose last axis is the head dim, as `[rows, head_dim]` (free reshape)."""
    return cache.reshape(-1, cache.shape[-1])


def _scales_view(scales) -> jax.Array | None:
    """Per-token-head scales (a cache's shape without its head dim) as `[rows]` float32, or None."""
    return None if scales is None else scales.reshape(-1).astype(jnp.float32)


def page_attention_batch(
    query, key_cache, value_cache, context_lens, block_tables, /, *, attn_scale=None, max_context_len=None,
    num_splits=0, mask_value=DEFAULT_MASK_VALUE, attn_logits_soft_cap=None, pages_per_compute_block=None,
    megacore_mode=None, inline_seq_dim=True, sliding_window=None, key_cache_scales=None, value_cache_scales=None,
) -> PagedBatch:  # fmt: skip
    """`page_attention`: one query per sequence (decode), caches `[blocks, Hkv, block_size, D]`."""
    del mask_value, pages_per_compute_block, megacore_mode, inline_seq_dim
    num_seqs, _, head_dim = query.shape
    num_blocks, num_kv_heads, block_size, _ = key_cache.shape
    capacity = block_tables.shape[1] * block_size
    capacity = capacity if max_context_len is None else min(capacity, int(max_context_len))
    return PagedBatch(
        queries=query,
        key_rows=_rows_view(key_cache),
        value_rows=_rows_view(value_cache),
        page_tables=block_tables.astype(jnp.int32),
        query_start=jnp.arange(num_seqs, dtype=jnp.int32),
        query_len=jnp.ones((num_seqs,), jnp.int32),
        kv_len=clamp_lengths(context_lens, capacity),
        key_scales=_scales_view(key_cache_scales),
        value_scales=_scales_view(value_cache_scales),
        static=PagedStatic(
            rows=CacheRows(block_size, num_blocks, num_kv_heads * block_size, 1, block_size),
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            softmax_scale=resolve_scale(attn_scale, head_dim, "attn_scale"),
            soft_cap=check_soft_cap(attn_logits_soft_cap, "attn_logits_soft_cap"),
            window=last_positions_window(sliding_window),
            max_kv_len=capacity,
            num_splits=int(num_splits),
        ),
    )


def prefill_batch(
    query, key_cache, value_cache, context_len, page_indices, /, *, softmax_scale=None,
    mask_value=DEFAULT_MASK_VALUE, attn_logits_soft_cap=None, sliding_window=None, key_cache_scales=None,
    value_cache_scales=None,
) -> PagedBatch:  # fmt: skip
    """`prefill_page_attention`: the last `chunk` positions of one sequence; caches `[Hkv, pages, page_size, D]`."""
    del mask_value
    chunk, _, head_dim = query.shape
    num_kv_heads, num_pages, page_size, _ = key_cache.shape
    return PagedBatch(
        queries=query,
        key_rows=_rows_view(key_cache),
        value_rows=_rows_view(value_cache),
        page_tables=page_indices.astype(jnp.int32)[None, :],
        query_start=jnp.zeros((1,), jnp.int32),
        query_len=jnp.full((1,), chunk, jnp.int32),
        kv_len=clamp_lengths(context_len.reshape(1), page_indices.shape[0] * page_size),
        key_scales=_scales_view(key_cache_scales),
        value_scales=_scales_view(value_cache_scales),
        static=PagedStatic(
            rows=CacheRows(page_size, num_pages, page_size, 1, num_pages * page_size),
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            softmax_scale=resolve_scale(softmax_scale, head_dim),
            soft_cap=check_soft_cap(attn_logits_soft_cap, "attn_logits_soft_cap"),
            window=last_positions_window(sliding_window),
            max_kv_len=page_indices.shape[0] * page_size,
        ),
    )


def clamp_lengths(kv_len, capacity: int) -> jax.Array:
    """Key lengths as int32, clamped to `[0, capacity]` (the positions of a page table row, or the op's bound)."""
    return jnp.clip(kv_len.astype(jnp.int32), 0, capacity)


def ragged_queries(query_start_loc, count, num_seqs: int, num_tokens: int):
    """`(query_start, query_len)` `[N]` int32 of cumulative bounds `query_start_loc [N + 1]`.

    The bounds are clamped to `[0, num_tokens]` and made non-decreasing (a running max), so sequences
    own disjoint token ranges; `count` is clamped to `[0, N]` and sequences from it on get no queries.
    """
    loc = lax.cummax(jnp.clip(query_start_loc.astype(jnp.int32), 0, num_tokens))
    count = jnp.clip(jnp.asarray(count, jnp.int32).reshape(-1)[0], 0, num_seqs)
    lengths = jnp.where(jnp.arange(num_seqs) < count, loc[1:] - loc[:-1], 0)
    return loc[:-1], lengths


def _interleaved_rows(num_pages: int, page_size: int, combined_heads: int) -> CacheRows:
    """Rows of a `[pages, page_size, combined heads, width]` cache holding K of head h at 2h and V at 2h + 1."""
    return CacheRows(page_size, num_pages, page_size * combined_heads, combined_heads, 2, 0, 1)


def ragged_v2_batch(
    queries, kv_pages, context_lens, block_tables, query_start_loc, num_seqs, softmax_aux=None, /, *,
    softmax_scale=None, logits_soft_cap=None, compute_dtype=jnp.bfloat16, optimized=False, sliding_window=None,
    mask_value=None, vmem_limit_bytes=None, kv_cache_scales=None,
) -> PagedBatch:  # fmt: skip
    """`ragged_page_attention_v2`: packed queries, one cache `[pages, page_size, 2 Hkv, D]` (K even, V odd)."""
    del optimized, mask_value, vmem_limit_bytes
    _, num_heads, head_dim = queries.shape
    num_pages, page_size, combined_heads, _ = kv_pages.shape
    view, scales = _rows_view(kv_pages), _scales_view(kv_cache_scales)
    query_start, query_len = ragged_queries(query_start_loc, num_seqs, context_lens.shape[0], queries.shape[0])
    return PagedBatch(
        queries=queries,
        key_rows=view,
        value_rows=view,
        page_tables=block_tables.astype(jnp.int32),
        query_start=query_start,
        query_len=query_len,
        kv_len=clamp_lengths(context_lens, block_tables.shape[1] * page_size),
        sinks=fold_sinks(softmax_aux, num_heads),
        key_scales=scales,
        value_scales=scales,
        static=PagedStatic(
            rows=_interleaved_rows(num_pages, page_size, combined_heads),
            num_kv_heads=combined_heads // 2,
            head_dim=head_dim,
            softmax_scale=resolve_scale(softmax_scale, head_dim),
            soft_cap=check_soft_cap(logits_soft_cap),
            window=last_positions_window(sliding_window),
            compute_dtype=None if compute_dtype is None else jnp.dtype(compute_dtype).name,
            max_kv_len=block_tables.shape[1] * page_size,
        ),
    )


def quantized_logits(queries, scale: float, q_scale, k_scale, kv_cache):
    """`(queries, logit scale)` for a quantised cache: with `q_scale` the queries quantised like the cache
    (`quantize_queries`) and the logits scaled back; `k_scale` scales the logits (dequantised keys)."""
    if q_scale is not None:
        queries = quantize_queries(queries, q_scale, kv_cache.dtype)
        scale *= float(q_scale)
    if k_scale is not None:
        scale *= float(k_scale)
    return queries, scale


def ragged_v3_batch(
    queries, keys, values, kv_cache, kv_lens, block_tables, query_start_loc, distribution, softmax_aux=None, /, *,
    softmax_scale=1.0, sliding_window=None, logits_soft_cap=None, q_scale=None, k_scale=None, v_scale=None,
    vmem_limit_bytes=None, kv_cache_scales=None,
) -> PagedBatch:  # fmt: skip
    """`ragged_page_attention_v3`: writes the new keys/values into the packed cache, then reads it as K/V rows.

    The updated cache is the batch's `key_rows` (reshaped back by the implementations). With `q_scale`
    the queries are quantised like the cache (`quantize_queries`) and the logits scaled back;
    `k_scale` scales the logits and `v_scale` the output (dequantised K and V). With `kv_cache_scales` the
    new keys/values are quantised per token-head as they are written (`write_kv_cache`), and the updated
    scales are the batch's `key_scales` (flat).
    """
    del vmem_limit_bytes
    _, num_heads, head_dim = queries.shape
    num_pages, page_size, groups, packing, _ = kv_cache.shape
    max_seqs = kv_lens.shape[0]
    tables = block_tables.astype(jnp.int32).reshape(max_seqs, -1)
    kv_len = clamp_lengths(kv_lens, tables.shape[1] * page_size)
    query_start, query_len = ragged_queries(query_start_loc, distribution[2], max_seqs, queries.shape[0])
    kv_cache, kv_cache_scales = write_kv_cache(
        keys, values, kv_cache, tables, kv_len, query_start, query_len, kv_cache_scales
    )
    view, scales = _rows_view(kv_cache), _scales_view(kv_cache_scales)
    queries, scale = quantized_logits(queries, resolve_scale(softmax_scale, head_dim), q_scale, k_scale, kv_cache)
    return PagedBatch(
        queries=queries,
        key_rows=view,
        value_rows=view,
        page_tables=tables,
        query_start=query_start,
        query_len=query_len,
        kv_len=kv_len,
        sinks=fold_sinks(softmax_aux, num_heads),
        key_scales=scales,
        value_scales=scales,
        static=PagedStatic(
            rows=_interleaved_rows(num_pages, page_size, groups * packing),
            num_kv_heads=keys.shape[1],
            head_dim=head_dim,
            softmax_scale=scale,
            soft_cap=check_soft_cap(logits_soft_cap),
            window=last_positions_window(sliding_window),
            value_scale=None if v_scale is None else float(v_scale),
            max_kv_len=tables.shape[1] * page_size,
        ),
    )


def latent_options(
    queries_nope, queries_pe, *, softmax_scale=None, sliding_window=None, logits_soft_cap=None, q_scale=None,
    k_scale=None, v_scale=None,
) -> dict:  # fmt: skip
    """The MLA ops' options as `latent_batch` takes them, static and hashable (jit keys on them): the default
    scale `(L + R) ** -0.5` resolved, scales as floats, the window as an int."""
    if softmax_scale is None:
        softmax_scale = (queries_nope.shape[-1] + queries_pe.shape[-1]) ** -0.5
    floats = lambda x: None if x is None else float(x)
    return dict(
        softmax_scale=float(softmax_scale), sliding_window=None if sliding_window is None else int(sliding_window),
        logits_soft_cap=floats(logits_soft_cap), q_scale=floats(q_scale), k_scale=floats(k_scale),
        v_scale=floats(v_scale),
    )  # fmt: skip


def latent_batch(
    queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
    /, *, softmax_scale, sliding_window=None, logits_soft_cap=None, q_scale=None, k_scale=None, v_scale=None,
    kv_cache_scales=None,
) -> PagedBatch:  # fmt: skip
    """`multi_latent_ragged_page_attention`: writes the new latent rows, then MQA over one shared latent head.

    A cache row `[c (L), 0..., r (R), 0...]` is the key, scored against the packed query
    `[q_nope, 0..., q_pe, 0...]` (the row's width, in the promoted dtype of queries and a 16/32-bit cache, in
    the queries' with a float8 cache), and through
    its first `L` columns the value: the core's output keeps `L` of its columns. The cache
    `[pages, rows, packing, width]` viewed as `[pages * page_size, width]` holds position `i` of page `g` at
    row `g * page_size + i` (packing only folds the slot axis). The updated cache is the batch's `key_rows`.
    Quantisation as `ragged_v3_batch`; with `kv_cache_scales` (`[pages, rows, packing]`) each new row is quantised
    as a whole and its scale serves key and value (`write_latents`). Trusts its arguments: `keys_values [T, L]`,
    `keys_pe [T, R]`, 1-D `block_tables`, a resolved float `softmax_scale`.
    """
    num_tokens, num_heads, latent = queries_nope.shape
    rope = queries_pe.shape[-1]
    num_pages, rows, packing, width = kv_cache.shape
    page_size = rows * packing
    num_seqs = kv_lens.shape[0]
    tables = block_tables.astype(jnp.int32).reshape(num_seqs, -1)
    kv_len = clamp_lengths(kv_lens, tables.shape[1] * page_size)
    query_start, query_len = ragged_queries(query_start_loc, distribution[2], num_seqs, num_tokens)
    kv_cache, kv_cache_scales = write_latents(
        kv_cache, keys_values, keys_pe, kv_len, tables, query_start, query_len, kv_cache_scales
    )

    compute = jnp.promote_types(queries_nope.dtype, queries_pe.dtype)
    if jnp.dtype(kv_cache.dtype).itemsize > 1:  # an 8-bit cache computes in the queries' dtype (JAX won't promote)
        compute = jnp.promote_types(compute, kv_cache.dtype)
    rope_col = rope_column(latent)
    queries = jnp.zeros((num_tokens, num_heads, width), compute)
    queries = queries.at[..., :latent].set(queries_nope.astype(compute))
    queries = queries.at[..., rope_col : rope_col + rope].set(queries_pe.astype(compute))
    queries, scale = quantized_logits(queries, float(softmax_scale), q_scale, k_scale, kv_cache)
    view, scales = _rows_view(kv_cache), _scales_view(kv_cache_scales)
    return PagedBatch(
        queries=queries,
        key_rows=view,
        value_rows=view,
        page_tables=tables,
        query_start=query_start,
        query_len=query_len,
        kv_len=kv_len,
        key_scales=scales,
        value_scales=scales,
        static=PagedStatic(
            rows=CacheRows(page_size, num_pages, page_size, 1, 1),
            num_kv_heads=1,
            head_dim=width,
            softmax_scale=scale,
            soft_cap=None if logits_soft_cap is None else abs(float(logits_soft_cap)),
            window=last_positions_window(sliding_window),
            value_scale=None if v_scale is None else float(v_scale),
            max_kv_len=tables.shape[1] * page_size,
        ),
    )


def written(out, batch: PagedBatch, cache):
    """An op that writes its cache returns `(out, cache)`, or `(out, cache, scales)` where the cache has scales:
    the updated ones of `batch` reshaped to the input cache's layout."""
    updated = batch.key_rows.reshape(cache.shape)
    if batch.key_scales is None:
        return out, updated
    return out, updated, batch.key_scales.reshape(cache.shape[:-1])


def ragged_decode_batch(
    query, key, value, sequence_start, sequence_end, softmax_aux=None, /, *, softmax_scale=None,
    sliding_window=None, logits_soft_cap=None, key_cache_scales=None, value_cache_scales=None,
) -> PagedBatch:  # fmt: skip
    """`ragged_decode_attention`: dense `[B, S, Hkv, D]` K/V, each row a page of its own; keys `[start, end)`."""
    batch, seq_len, num_kv_heads, head_dim = key.shape
    query = query.reshape(batch, -1, head_dim)
    end = clamp_lengths(sequence_end, seq_len)
    return PagedBatch(
        queries=query,
        key_rows=_rows_view(key),
        value_rows=_rows_view(value),
        page_tables=jnp.arange(batch, dtype=jnp.int32)[:, None],
        query_start=jnp.arange(batch, dtype=jnp.int32),
        query_len=jnp.ones((batch,), jnp.int32),
        kv_len=end,
        kv_start=jnp.clip(sequence_start.astype(jnp.int32), 0, end),
        sinks=fold_sinks(softmax_aux, query.shape[1]),
        key_scales=_scales_view(key_cache_scales),
        value_scales=_scales_view(value_cache_scales),
        static=PagedStatic(
            rows=CacheRows(seq_len, batch, seq_len * num_kv_heads, num_kv_heads, 1),
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            softmax_scale=resolve_scale(softmax_scale, head_dim),
            soft_cap=check_soft_cap(logits_soft_cap),
            window=decode_window(sliding_window),
            max_kv_len=seq_len,
        ),
    )


def unified_batch(
    queries, key_cache, value_cache, kv_lens, block_tables, query_start_loc, alibi_slopes=None, qq_bias=None,
    softmax_aux=None, /, *, softmax_scale=None, causal=True, sliding_window=None, logits_soft_cap=None,
    seq_threshold_3d=None, key_cache_scales=None, value_cache_scales=None,
) -> PagedBatch:  # fmt: skip
    """`unified_attention`: packed queries, caches `[blocks, block_size, Hkv, D]`, ALiBi and query-query bias."""
    del seq_threshold_3d
    _, num_heads, head_dim = queries.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    query_start, query_len = ragged_queries(query_start_loc, kv_lens.shape[0], kv_lens.shape[0], queries.shape[0])
    return PagedBatch(
        queries=queries,
        key_rows=_rows_view(key_cache),
        value_rows=_rows_view(value_cache),
        page_tables=block_tables.astype(jnp.int32),
        query_start=query_start,
        query_len=query_len,
        kv_len=clamp_lengths(kv_lens, block_tables.shape[1] * block_size),
        sinks=fold_sinks(softmax_aux, num_heads),
        alibi_slopes=alibi_slopes,
        qq_bias=qq_bias,
        key_scales=_scales_view(key_cache_scales),
        value_scales=_scales_view(value_cache_scales),
        static=PagedStatic(
            rows=CacheRows(block_size, num_blocks, block_size * num_kv_heads, num_kv_heads, 1),
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            softmax_scale=resolve_scale(softmax_scale, head_dim),
            soft_cap=check_soft_cap(logits_soft_cap),
            window=last_positions_window(sliding_window),
            causal=bool(causal),
            max_kv_len=block_tables.shape[1] * block_size,
        ),
    )
