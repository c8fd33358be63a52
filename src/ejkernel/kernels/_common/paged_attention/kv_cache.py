"""The caches the serving ops write: `ragged_page_attention_v3`'s packed layout, MLA's packed latent rows, where
new tokens go, the writes.

Also the queries quantised like a cache (`quantize_queries`), which the quantised ops score against it; caches that
carry scales quantise their new rows with `scaled_codes.quantize_rows`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.paged_attention.problem import page_in_cache
from ejkernel.kernels._common.scaled_codes import code_values, quantize_rows, to_codes
from ejkernel.kernels._common.search import sorted_position


def kv_packing(dtype) -> int:
    """How many cache elements share one 32-bit word in `ragged_page_attention_v3`'s cache layout."""
    return max(1, 32 // (8 * jnp.dtype(dtype).itemsize))


def v3_cache_shape(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int, dtype) -> tuple[int, ...]:
    """`[pages, page_size, ceil(2 Hkv / packing), packing, head_dim rounded up to 128]`."""
    packing = kv_packing(dtype)
    return (num_pages, page_size, -(-2 * num_kv_heads // packing), packing, -(-head_dim // 128) * 128)


def new_token_rows(tables, kv_lens, query_start, query_len, num_tokens: int, page_size: int, num_pages: int):
    """`[T]` int32: the row, in a cache viewed as `[pages * page_size, ...]`, where each new token goes.

    Token `j` of sequence `s` (its queries are the last positions of its context; `kv_lens` clamped to
    the table) goes to position `pos = kv_lens[s] - query_len[s] + j`: row `page * page_size + pos %
    page_size` of page `tables[s, pos // page_size]`. Tokens of no sequence, positions below 0 and pages
    outside the cache get `pages * page_size`, which a scatter with `mode="drop"` drops; of tokens
    naming one row only the last keeps it (as if written in order), so the rows kept are unique.
    """
    dropped = num_pages * page_size
    token = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.clip(sorted_position(query_start + query_len, token), 0, tables.shape[0] - 1)
    offset = token - query_start[seq]
    pos = kv_lens[seq] - query_len[seq] + offset
    column = pos // page_size
    page = tables[seq, jnp.clip(column, 0, tables.shape[1] - 1)]
    valid = (offset >= 0) & (offset < query_len[seq]) & (pos >= 0) & (column < tables.shape[1])
    rows = jnp.where(valid & page_in_cache(page, num_pages), page * page_size + pos % page_size, dropped)
    order = jnp.argsort(rows, stable=True)
    ranked = rows[order]
    overwritten = (ranked == jnp.roll(ranked, -1)) & (token < num_tokens - 1)
    return rows.at[order].set(jnp.where(overwritten, dropped, ranked), unique_indices=True)


def write_kv_cache(keys, values, kv_cache, tables, kv_lens, query_start, query_len, scales=None):
    """`(cache, scales)`: the cache of `ragged_page_attention_v3` with each sequence's new keys/values written in.

    Token `j` of sequence `s` goes to its row of `new_token_rows` (`tables [N, W]`, clamped `kv_lens`,
    the sequences' queries); kv head `h` fills combined head `2h` (key) and `2h + 1` (value), the head
    dim zero-padded. With `scales` (`[pages, page_size, groups, packing]` float32) each new token-head is
    quantised (`quantize_rows`) and its scale written beside it (padded heads get scale 1); without, the
    rows are cast and `scales` stays None. A scatter of the new rows only, so under `jit` with the cache
    (and scales) donated the update happens in place.
    """
    num_tokens, num_kv_heads, head_dim = keys.shape
    num_pages, page_size, groups, packing, width = kv_cache.shape
    flat_slot = new_token_rows(tables, kv_lens, query_start, query_len, num_tokens, page_size, num_pages)
    new = jnp.stack([keys, values], axis=2).reshape(num_tokens, 2 * num_kv_heads, head_dim)
    heads = groups * packing - 2 * num_kv_heads
    if scales is not None:
        new, new_scales = quantize_rows(new, kv_cache.dtype)
        new_scales = jnp.pad(new_scales, ((0, 0), (0, heads)), constant_values=1.0)
        flat_scales = scales.reshape(num_pages * page_size, groups * packing)
        flat_scales = flat_scales.at[flat_slot].set(new_scales, mode="drop", unique_indices=True)
        scales = flat_scales.reshape(scales.shape)
    new = jnp.pad(new.astype(kv_cache.dtype), ((0, 0), (0, heads), (0, width - head_dim)))
    flat = kv_cache.reshape(num_pages * page_size, groups * packing, width)
    flat = flat.at[flat_slot].set(new, mode="drop", unique_indices=True)
    return flat.reshape(kv_cache.shape), scales


def rope_column(latent: int) -> int:
    """Where the RoPE key starts in a latent cache row `[c (L), 0..., r (R), 0...]`: `L` rounded up to 128."""
    return -(-latent // 128) * 128


def write_latents(kv_cache, keys_values, keys_pe, kv_lens, tables, query_start, query_len, scales=None):
    """`(cache, scales)`: the MLA cache `[pages, rows, packing, width]` with each new token's row `[c, 0..., r, 0...]`
    written in.

    Token `j` of sequence `s` goes to its row of `new_token_rows` (`tables [N, W]`, clamped `kv_lens`, the
    sequences' queries), cast to the cache dtype; with `scales` (`[pages, rows, packing]` float32) the row is
    quantised as a whole (`quantize_rows`) and its scale written beside it. A scatter of the new rows only (in
    place under donation).
    """
    num_pages, rows, packing, width = kv_cache.shape
    page_size = rows * packing
    num_tokens, latent = keys_values.shape
    row = new_token_rows(tables, kv_lens, query_start, query_len, num_tokens, page_size, num_pages)
    rope_col = rope_column(latent)
    stage = jnp.float32 if scales is not None else kv_cache.dtype
    new = jnp.zeros((num_tokens, width), stage)
    new = new.at[:, :latent].set(keys_values.astype(stage))
    new = new.at[:, rope_col : rope_col + keys_pe.shape[1]].set(keys_pe.astype(stage))
    if scales is not None:
        new, new_scales = quantize_rows(new, kv_cache.dtype)
        flat_scales = scales.reshape(num_pages * page_size)
        scales = flat_scales.at[row].set(new_scales, mode="drop", unique_indices=True).reshape(scales.shape)
    flat = kv_cache.reshape(num_pages * page_size, width)
    flat = flat.at[row].set(new.astype(kv_cache.dtype), mode="drop", unique_indices=True)
    return flat.reshape(kv_cache.shape), scales


def quantize_queries(queries, q_scale: float, dtype) -> jax.Array:
    """`queries / q_scale` rounded to the cache's `dtype` (`to_codes`), kept in the queries' dtype, which the
    output keeps."""
    return code_values(to_codes(queries / q_scale, dtype), queries.dtype)
