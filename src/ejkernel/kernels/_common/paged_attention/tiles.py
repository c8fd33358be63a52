"""What the serving kernels share: query tiles in (`prepare_tiles`), partial sums out (`finish_tiles`).

A kernel works on rows of (query, grouped head) per kv head (`tile_rows`) and reads each tile's
metadata from the columns `SEQ`, `LO`, `HI`, `CONTEXT`, `FIRST`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.paged_attention.core_math import PagedQueryTiles, finalize, key_span, query_tiles
from ejkernel.kernels._common.paged_attention.problem import PagedBatch

SEQ, LO, HI, CONTEXT, FIRST = range(5)  # columns of the per-tile metadata the kernels read


def tile_rows(x: jax.Array, num_kv_heads: int, rows: int) -> jax.Array:
    """`[..., Bq, Hq, X]` -> `[..., Hkv, rows, X]` with row `i * G + g` (zero rows pad up to `rows`)."""
    *lead, block_q, num_heads, tail = x.shape
    group = num_heads // num_kv_heads
    x = x.reshape(*lead, block_q, num_kv_heads, group, tail)
    x = jnp.moveaxis(x, -3, -4).reshape(*lead, num_kv_heads, block_q * group, tail)
    return jnp.pad(x, [(0, 0)] * (len(lead) + 1) + [(0, rows - block_q * group), (0, 0)])


def untile_rows(x: jax.Array, block_q: int, num_heads: int) -> jax.Array:
    """Inverse of `tile_rows` on `[..., Hkv, rows, X]` -> `[..., Bq, Hq, X]`."""
    *lead, num_kv_heads, _, tail = x.shape
    group = num_heads // num_kv_heads
    x = x[..., : block_q * group, :].reshape(*lead, num_kv_heads, block_q, group, tail)
    return jnp.moveaxis(x, -4, -3).reshape(*lead, block_q, num_heads, tail)


def prepare_tiles(batch: PagedBatch, block_q: int, rows: int, width: int, num_tiles: int | None = None):
    """What a kernel reads of its query tiles: `(tiles, meta [R, 5] int32, q [R, Hkv, rows, width], alibi)`
    (`num_tiles`: a static bound on R, see `query_tiles`).

    `meta` holds each tile's sequence, key span (lo, hi), context (`kv_len - q_len`) and first query;
    `q` its query rows (`tile_rows`, in the compute dtype, zero-padded to `width`); `alibi [Hkv, rows]`
    the rows' ALiBi slopes (float32) or None.
    """
    st = batch.static
    num_tokens, num_heads, _ = batch.queries.shape
    compute = jnp.dtype(st.compute_dtype) if st.compute_dtype is not None else batch.queries.dtype
    tiles = query_tiles(batch, block_q, num_tiles)
    seq = tiles.seq
    context = batch.kv_len[seq] - batch.query_len[seq]
    kv_start = None if batch.kv_start is None else batch.kv_start[seq]
    lo, hi = key_span(st, batch.kv_len[seq], kv_start, context, tiles.first, block_q, tiles.valid)
    meta = jnp.stack([seq, lo, hi, context, tiles.first], axis=1).astype(jnp.int32)
    padded = jnp.concatenate([batch.queries, jnp.zeros((1, *batch.queries.shape[1:]), batch.queries.dtype)])
    q = padded[jnp.minimum(tiles.token, num_tokens)].astype(compute)  # [R, Bq, Hq, D]
    q = jnp.pad(q, ((0, 0), (0, 0), (0, 0), (0, width - st.head_dim)))
    alibi = None
    if batch.alibi_slopes is not None:
        slopes = jnp.broadcast_to(batch.alibi_slopes.astype(jnp.float32)[:, None], (block_q, num_heads, 1))
        alibi = tile_rows(slopes, st.num_kv_heads, rows)[..., 0]
    return tiles, meta, tile_rows(q, st.num_kv_heads, rows), alibi


def finish_tiles(batch: PagedBatch, tiles: PagedQueryTiles, block_q: int, acc, m, denom, with_lse: bool = False):
    """A kernel's per-split partial sums in tile rows (`acc [S, R, Hkv, rows, W]`, `m`, `denom`) -> `[T, Hq, D]`
    (`with_lse`: and its log-sum-exp `[T, Hq]`, see `finalize`)."""
    acc = untile_rows(acc, block_q, batch.num_heads)
    m, denom = (untile_rows(x[..., None], block_q, batch.num_heads)[..., 0] for x in (m, denom))
    st, num_tokens, dtype = batch.static, batch.num_tokens, batch.queries.dtype
    return finalize(acc, m, denom, batch.sinks, st, tiles, num_tokens, dtype, with_lse)
