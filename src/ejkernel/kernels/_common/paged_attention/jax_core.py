"""The serving ops' attention core in plain JAX: tiles of queries walk their own pages, chunk by chunk.

The queries are cut into tiles of `block_q` queries of one sequence (`query_tiles`); every tile walks
the key span its queries may see (`key_span`: up to its last query's position, from its window's left
edge) in chunks of `block_k` positions, all tiles together, with an online softmax. Each step gathers,
for every tile, only the cache rows of the positions in its own chunk (page table lookup per
position), so no call reads more than the pages its sequences own, and never a whole cache or a
whole page table per sequence. The walk is a static loop over the longest span a tile can have; a
step in which every tile is done is skipped by a `cond`, so short contexts cost what they use.
Positions whose page-table entry is not a page of the cache are read clamped and masked (`page_in_cache`).
A quantised cache with per-row scales is read as stored: each step gathers its rows' scales beside them,
multiplies the logits' key columns by the key scales and the probabilities by the value scales before
`p @ v` (no dequantised copy of the cache).

Plain JAX end to end, so every gradient (queries, caches, sinks, biases) comes from autodiff. It serves
the XLA platform, and the kernels of the other platforms take their backward from it (and the calls with
no query or no sequence), which is why it lives here and not in the XLA backend.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.paged_attention.core_math import (
    adjust_logits,
    finalize,
    key_span,
    online_softmax_step,
    query_tiles,
    span_bound,
    tile_bias,
)
from ejkernel.kernels._common.paged_attention.implementations import config_tiling
from ejkernel.kernels._common.paged_attention.problem import PagedBatch, page_in_cache

# Bytes of keys + values one step gathers for all tiles, and of its float32 logits (default chunking).
GATHER_BUDGET = 64 * 2**20
LOGITS_BUDGET = 128 * 2**20


def _pow2_floor(n: int) -> int:
    return 1 << max(int(n), 1).bit_length() - 1


def default_block_q(batch: PagedBatch) -> int:
    """About the mean queries per sequence (1 for decode), as a power of two up to 64."""
    mean = -(-batch.num_tokens // max(batch.num_seqs, 1))
    return min(64, 1 << (max(mean, 1) - 1).bit_length())


def default_block_k(batch: PagedBatch, num_tiles: int, block_q: int) -> int:
    st = batch.static
    itemsize = jnp.dtype(batch.key_rows.dtype).itemsize
    by_gather = GATHER_BUDGET // max(1, num_tiles * st.num_kv_heads * batch.key_rows.shape[1] * itemsize * 2)
    by_logits = LOGITS_BUDGET // max(1, num_tiles * batch.num_heads * block_q * 4)
    return max(16, min(1024, _pow2_floor(min(by_gather, by_logits))))


def _gather(rows: jax.Array, index: jax.Array) -> jax.Array:
    return jnp.take(rows, index, axis=0, mode="clip")


def paged_attention_core(batch: PagedBatch, cfg=None, with_lse: bool = False):
    """`[T, Hq, D]` attention of every query over its sequence's pages (zeros for queries of no sequence);
    `with_lse`: `(out, lse [T, Hq] float32)`, as `finalize` gives it.

    The config's `block_q` (queries per tile) and `block_k` (key positions per step) tile the walk;
    unset, they follow the batch (one query per tile for decode, ~64 MiB gathered per step).
    """
    st, rows_of = batch.static, batch.static.rows
    num_tokens, num_heads, _ = batch.queries.shape
    dtype = batch.queries.dtype
    if num_tokens == 0 or batch.num_seqs == 0:
        out = jnp.zeros((num_tokens, num_heads, st.head_dim), dtype)
        return (out, jnp.full((num_tokens, num_heads), -jnp.inf, jnp.float32)) if with_lse else out
    params = config_tiling(cfg, st.rows.page_size)
    block_q = params.block_q or default_block_q(batch)
    tiles = query_tiles(batch, block_q)
    num_tiles = tiles.seq.shape[0]
    block_k = params.block_k or default_block_k(batch, num_tiles, block_q)
    bound = span_bound(st, block_q)
    block_k = min(block_k, 1 << max(bound - 1, 0).bit_length())
    num_steps = min(-(-bound // block_k) + 1, -(-st.max_kv_len // block_k))

    num_kv_heads = st.num_kv_heads
    group = num_heads // num_kv_heads
    compute = jnp.dtype(st.compute_dtype) if st.compute_dtype is not None else dtype
    padded = jnp.concatenate([batch.queries, jnp.zeros((1, *batch.queries.shape[1:]), dtype)])
    q = padded[jnp.minimum(tiles.token, num_tokens)].astype(compute)  # [R, Bq, Hq, D]
    q = q.reshape(num_tiles, block_q, num_kv_heads, group, -1)

    seq = tiles.seq
    kv_len, q_len = batch.kv_len[seq], batch.query_len[seq]
    context = kv_len - q_len
    kv_start = None if batch.kv_start is None else batch.kv_start[seq]
    lo, hi = key_span(st, kv_len, kv_start, context, tiles.first, block_q, tiles.valid)
    first_chunk = lo // block_k
    chunks = jnp.where(hi > lo, -(-hi // block_k) - first_chunk, 0)
    q_index = tiles.first[:, None] + jnp.arange(block_q, dtype=jnp.int32)  # [R, Bq]
    q_pos = (context[:, None] + q_index)[:, None, None, :, None]  # against logits [R, Hkv, G, Bq, L]
    alibi = None
    if batch.alibi_slopes is not None:
        alibi = batch.alibi_slopes.reshape(num_kv_heads, group)[None, :, :, None, None]
    head_rows = jnp.arange(num_kv_heads, dtype=jnp.int32) * rows_of.head_stride
    tables = batch.page_tables

    def lookup(pos):
        """First cache rows of positions `pos [R, L]` of each tile's sequence, and whether their page is in the
        cache (entries outside it are read clamped, then masked)."""
        column = jnp.clip(pos // rows_of.page_size, 0, tables.shape[1] - 1)
        entry = tables[seq[:, None], column]
        page = jnp.clip(entry, 0, rows_of.num_pages - 1)
        base = page * rows_of.page_stride + (pos % rows_of.page_size) * rows_of.slot_stride
        return base, page_in_cache(entry, rows_of.num_pages)

    def read(rows_array, offset, base):
        """The rows of `lookup`'s positions -> `[R, L, Hkv, D]`."""
        out = _gather(rows_array, base[..., None] + head_rows + offset)
        return out[..., : st.head_dim].astype(compute)

    def read_scales(scales, offset, base):
        """The per-row scales of `lookup`'s positions, against logits `[R, Hkv, G, Bq, L]`; None without scales."""
        if scales is None:
            return None
        return _gather(scales, base[..., None] + head_rows + offset).swapaxes(1, 2)[:, :, None, None, :]

    def step(i, carry):
        pos = (first_chunk + i)[:, None] * block_k + jnp.arange(block_k, dtype=jnp.int32)  # [R, L]
        base, key_ok = lookup(pos)
        k = read(batch.key_rows, rows_of.key_offset, base)
        v = read(batch.value_rows, rows_of.value_offset, base)
        k_scales = read_scales(batch.key_scales, rows_of.key_offset, base)
        v_scales = read_scales(batch.value_scales, rows_of.value_offset, base)
        s = jnp.einsum("rqhgd,rkhd->rhgqk", q, k, preferred_element_type=jnp.float32) * st.softmax_scale
        if k_scales is not None:
            s = s * k_scales
        k_pos = pos[:, None, None, None, :]
        bias = tile_bias(
            st,
            k_pos,
            context[:, None, None, None, None],
            alibi,
            batch.qq_bias,
            q_index[:, None, None, :, None],
        )
        edge = lambda x: x[:, None, None, None, None]
        s = adjust_logits(s, q_pos, k_pos, edge(lo), edge(hi), st, bias, key_ok[:, None, None, None, :])

        def weigh_values(p):
            p = p if v_scales is None else p * v_scales
            return jnp.einsum("rhgqk,rkhd->rhgqd", p.astype(compute), v, preferred_element_type=jnp.float32)

        return online_softmax_step(carry, s, weigh_values)

    shape = (num_tiles, num_kv_heads, group, block_q)
    carry = (
        jnp.zeros((*shape, st.head_dim), jnp.float32),
        jnp.full(shape, -jnp.inf, jnp.float32),
        jnp.zeros(shape, jnp.float32),
    )
    carry = lax.fori_loop(
        0, num_steps, lambda i, c: lax.cond(jnp.any(i < chunks), lambda c: step(i, c), lambda c: c, c), carry
    )
    acc, m, denom = (x.reshape(num_tiles, num_heads, block_q, *x.shape[4:]).swapaxes(1, 2)[None] for x in carry)
    return finalize(acc, m, denom, batch.sinks, st, tiles, num_tokens, dtype, with_lse)
