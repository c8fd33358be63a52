"""What a Mosaic GPU prefill-tile call fixes at trace time, and which tiles and rows each CTA takes (plain `jnp`).

A prefill tile is 128 queries of one sequence's chunk for one query head: flash attention's forward CTA, whose
128-key tiles come from its sequence's pages. TMA copies into the kernels' tiled shared memory start at multiples
of 8 rows, so the long sequences' queries are first packed with each sequence from a multiple of 8 (one gather of
their rows: a 128-query tile read in place from an unaligned start would take a second tile for its last rows, a
fifth more work at 512-query chunks); rows past a sequence's queries compute what nobody reads. Each tile writes
its 128 output rows to its slot of an array of the static bound of tiles, from which each token's row is gathered
back. In place (`MosaicGpuPagedStatic.in_place`) the tiles instead read the batch's own query rows from any row
through an untiled shared-memory tile and write their sequence's rows straight into the output (`TOKEN`, `END`).
Per CTA, in launch order (longest key span first), `tile_plan` gives one row of the columns below; the kernel reads
them as scalars.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ejkernel.kernels._common.paged_attention.core_math import max_tiles
from ejkernel.kernels._common.paged_attention.problem import PagedBatch, page_in_cache
from ejkernel.kernels._common.search import sorted_position
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import CTA_ROWS

BLOCK = CTA_ROWS  # keys per streamed tile
ALIGN = 8  # rows: where a TMA copy into tiled shared memory may start
QUERY_ROW, SEQ, KV_LEN, POS0, CLEAN, TOKEN, END = range(7)
"""Columns of a tile's row (`tile_plan`'s `meta`, by slot): its first row of the packed queries over `ALIGN` (the
kernel multiplies it back, so the compiler knows the TMA copies' rows aligned), its sequence, the keys it may see
(`kv_len`, 0 for a slot of no tile: nothing to compute), the position of its first row, how many of the
sequence's first keys lie on pages of the cache (the key tiles past them are masked key by key), and, for tiles that
read and write the batch's token rows in place, its first token and the end of its sequence's tokens."""


@dataclasses.dataclass(frozen=True)
class MosaicGpuPagedStatic:
    """How the cache is read (hashable): a cache row view `[pages, page_size, slots, width]`, where kv head h's
    key (value) of a slot is `h * head_stride + key_offset` (`value_offset`); each 128-key tile is `copies`
    TMA copies of `rows_per_copy` rows."""

    page_size: int
    num_pages: int
    slots: int  # rows of one (page, position): every kv head's key and value rows
    head_stride: int
    key_offset: int
    value_offset: int
    stages: int = 2  # shared-memory slots per stream
    tiles_per_cta: int = 1  # 2: a CTA runs tiles c and c + R/2 of the launch order (half the CTAs of nothing)
    # the tiles read their queries from the batch's rows and write theirs into the other sequences' output in place
    in_place: bool = False

    @property
    def rows_per_copy(self) -> int:
        return min(self.page_size, BLOCK)

    @property
    def copies(self) -> int:
        return BLOCK // self.rows_per_copy


def padded_tables(batch: PagedBatch, copies: int):
    """The page tables with columns up to a whole number of key tiles (the extra entries name page 0: their
    keys lie past every `kv_len`, masked), so a tile's copies never index past a row."""
    width = batch.page_tables.shape[1]
    return jnp.pad(batch.page_tables, ((0, 0), (0, -width % copies)))


def clean_keys(batch: PagedBatch):
    """`[N]` int32: each sequence's first position whose page-table entry is not a page of the cache (else its
    table's capacity): keys before it need no page test."""
    st = batch.static
    tables = batch.page_tables
    columns = jnp.arange(tables.shape[1], dtype=jnp.int32)
    bad = ~page_in_cache(tables, st.rows.num_pages)
    return jnp.min(jnp.where(bad, columns, tables.shape[1]), axis=1) * st.rows.page_size


def tile_bound(num_tokens: int, long_seqs: int, tiles_per_cta: int = 1) -> int:
    """A static bound on the 128-query tiles of at most `long_seqs` sequences over `num_tokens` queries (a
    multiple of `tiles_per_cta`)."""
    return -(-max_tiles(num_tokens, long_seqs, CTA_ROWS) // tiles_per_cta) * tiles_per_cta


def packed_rows(num_tokens: int, long_seqs: int) -> int:
    """Rows of the packed queries: every long sequence's queries from a multiple of `ALIGN`, and room for the
    last tile's 128 rows (a multiple of `ALIGN`)."""
    return -(-(num_tokens + (ALIGN - 1) * long_seqs) // ALIGN) * ALIGN + CTA_ROWS - ALIGN


def tile_plan(batch: PagedBatch, long, num_tiles: int, num_rows: int):
    """`(meta [R, 7], order [R], sources [num_rows], held [T])` int32 for the sequences `long` ([N] bool): each
    slot's tile (columns above), the slots in launch order (longest key span first: the GPU starts CTAs in launch
    order, so the short ones fill the last wave and those of no query start last), the token each packed query
    row takes (any token where it holds none: what it computes is not read), and each token's output row
    (slot · 128 + its row in the tile; -1 for a token no tile holds)."""
    num_tokens, num_seqs = batch.num_tokens, batch.num_seqs
    q_len = jnp.where(long, batch.query_len, 0)
    rows = -(-q_len // ALIGN) * ALIGN
    ends = jnp.cumsum(rows)
    start = ends - rows  # each sequence's first packed row
    row = jnp.arange(num_rows, dtype=jnp.int32)
    seq = jnp.minimum(sorted_position(ends, row), num_seqs - 1)
    sources = jnp.clip(batch.query_start[seq] + row - start[seq], 0, num_tokens - 1).astype(jnp.int32)

    counts = -(-q_len // CTA_ROWS)
    tile_ends = jnp.cumsum(counts)
    slot = jnp.arange(num_tiles, dtype=jnp.int32)
    seq = sorted_position(tile_ends, slot).astype(jnp.int32)
    valid = seq < num_seqs
    seq = jnp.minimum(seq, num_seqs - 1)
    first = (slot - (tile_ends[seq] - counts[seq])) * CTA_ROWS  # the tile's first query in its sequence
    kv_len = jnp.where(valid, batch.kv_len[seq], 0)
    pos0 = batch.kv_len[seq] - batch.query_len[seq] + first
    query_row = jnp.where(valid, start[seq] + first, 0)  # (a slot of no tile: row 0, never out of the rows)
    first_token, end = batch.query_start[seq] + first, batch.query_start[seq] + batch.query_len[seq]
    columns = [query_row // ALIGN, seq, kv_len, pos0, clean_keys(batch)[seq], first_token, end]
    meta = jnp.stack(columns, axis=1)
    span = jnp.clip(jnp.minimum(kv_len, pos0 + CTA_ROWS), 0, None)
    order = jnp.argsort(-span, stable=True).astype(jnp.int32)

    index = first[:, None] + jnp.arange(CTA_ROWS, dtype=jnp.int32)[None, :]  # the tile's queries in their sequence
    token = jnp.where(
        valid[:, None] & (index < q_len[seq][:, None]), batch.query_start[seq][:, None] + index, num_tokens
    )
    out_rows = slot[:, None] * CTA_ROWS + jnp.arange(CTA_ROWS, dtype=jnp.int32)[None, :]
    held = jnp.full((num_tokens,), -1, jnp.int32)
    held = held.at[token.reshape(-1)].set(out_rows.reshape(-1), mode="drop", unique_indices=True)
    return meta.astype(jnp.int32), order, sources, held
