"""What a Mosaic GPU prefill-tile call fixes at trace time, and what each CTA reads of its tile (plain `jnp`).

The prefill tiles are 128 queries of one sequence's chunk (`query_tiles` with `CTA_ROWS`) for one query head:
flash attention's forward CTA, whose 128-key tiles come from the sequence's pages. Per CTA, in launch order
(longest key span first), `tile_meta` gives one row of the columns below; the kernel reads them as scalars.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ejkernel.kernels._common.paged_attention.core_math import PagedQueryTiles
from ejkernel.kernels._common.paged_attention.problem import PagedBatch, page_in_cache
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import CTA_ROWS

BLOCK = CTA_ROWS  # keys per streamed tile
TILE, SEQ, KV_LEN, POS0, CLEAN = range(5)
"""Columns of a CTA's row: its query tile (row of the gathered queries / 128), sequence, the keys it may see
(`kv_len`, 0 for a tile of no query), the position of its first query, and how many of the sequence's first
keys lie on pages of the cache (the tiles past them are masked key by key)."""


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


def tile_meta(batch: PagedBatch, tiles: PagedQueryTiles):
    """`[R, 5]` int32 rows of the CTAs (columns above), longest key span first: the GPU starts CTAs in launch
    order, so the short ones fill the last wave."""
    seq = tiles.seq
    kv_len = jnp.where(tiles.valid, batch.kv_len[seq], 0)
    pos0 = batch.kv_len[seq] - batch.query_len[seq] + tiles.first
    span = jnp.clip(jnp.minimum(kv_len, pos0 + CTA_ROWS), 0, None)
    order = jnp.argsort(-span, stable=True).astype(jnp.int32)
    meta = jnp.stack([jnp.arange(seq.shape[0], dtype=jnp.int32), seq, kv_len, pos0, clean_keys(batch)[seq]], axis=1)
    return meta[order].astype(jnp.int32)
