"""The prefill tiles of a paged batch on the Mosaic GPU flash attention forward (`flash_attention._fwd`).

The forward runs unchanged (warp-specialised, wgmma, online softmax, its schedules); a walk tells it where
things are. A CTA is 128 queries of one sequence's chunk and one query head, read from the packed queries
(`_tiling`) and written to its tile's slot of the output, or in place (`MosaicGpuPagedStatic.in_place`) read from
the batch's own rows, at any row, and written only where its sequence's tokens are, into the output of the other
sequences (the forward's `into`: an untiled shared-memory tile per warpgroup between q and HBM, stores in boxes
of binary-digit row counts); its key tiles are the
sequence's positions [0, hi) in steps of 128, each tile `copies` TMA copies of whole pages (page 16: 8
copies per operand onto the step's barrier), the pages read from the page table as scalars by the memory
warpgroup. Steps whose keys every row may see (before the chunk's first query, on pages of the cache) run
unmasked; the rest are masked by position (causal inside the chunk, keys past `kv_len`) and by page (a
position whose page-table entry is not a page of the cache holds no key). CTAs of the static bound that
hold no query (`kv_len` 0 in their row) skip their compute warpgroups.
"""

from __future__ import annotations

import copy
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ejkernel.kernels._common.paged_attention.problem import PagedBatch
from ejkernel.kernels._pallas.gpu.flash_attention._fwd import forward
from ejkernel.kernels._pallas.gpu.flash_attention._parts import (
    MASKED,
    ROWS,
    KeyTiles,
    Stream,
    wgmma_iota,
)
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import CTA_ROWS, MosaicGpuFlashStatic
from ejkernel.kernels._pallas.gpu.paged_attention._tiling import (
    ALIGN,
    BLOCK,
    CLEAN,
    END,
    KV_LEN,
    POS0,
    QUERY_ROW,
    SEQ,
    TOKEN,
    MosaicGpuPagedStatic,
    packed_rows,
    padded_tables,
    tile_bound,
    tile_plan,
)


def _cdiv(a, b: int):
    return lax.div(a + (b - 1), jnp.int32(b))


class PageRows:
    """Rows `rows` of every slot of a `(stages, BLOCK, D)` ring buffer, indexed as `feed` indexes buffers
    (`.at[slot]`): where one copy of a step lands."""

    def __init__(self, buffer, rows):
        self.buffer, self.rows = buffer, rows

    @property
    def at(self):
        return self

    def __getitem__(self, slot):
        return self.buffer.at[slot, self.rows]


class PagedKeyTiles(KeyTiles):
    """The forward's walk over a paged cache: the key tiles [0, hi) of each CTA's sequence (module docstring).

    Tile j of CTA c is slot `order[c + j·R/2]` (one tile a CTA: `order[c]`); its output rows start at
    slot · 128, which is how `own` and `mask` (given a first output row) find the slot's row of `meta`.
    """

    def __init__(
        self, st: MosaicGpuFlashStatic, paged: MosaicGpuPagedStatic, meta, order, tables, in_place: bool = False
    ):
        super().__init__(st, BLOCK, 0, meta.shape[0], paged.tiles_per_cta)
        self.paged, self.copies, self.arrays = paged, paged.copies, (meta, order, tables)
        self.in_place = in_place

    def bind(self, refs, b, h):
        bound = copy.copy(self)
        bound.meta_ref, bound.order_ref, bound.tables_ref = refs
        bound.kv_head = lax.div(h, jnp.int32(self.st.group))
        return bound

    def _slot(self, cta, j):
        per_cta = self.num_q_tiles // self.tiles_per_cta
        return self.order_ref[cta if self.tiles_per_cta == 1 else cta + j * per_cta]

    def _of(self, slot, column):
        value = self.meta_ref[slot, column]
        return value * ALIGN if column == QUERY_ROW else value

    def live(self):  # (a CTA's first tile is its longer one)
        return self._of(self._slot(lax.axis_index("q_tiles"), 0), KV_LEN) > 0

    def row(self, cta, j):
        return self._of(self._slot(cta, j), QUERY_ROW)

    def tile(self, cta, j):
        """`(first output row, 0, hi, entry)`: `entry(position)` is the page-table entry of a key position of the
        tile's sequence (what `streams` copies by, in place of a first key row)."""
        slot = self._slot(cta, j)
        kv_len, pos0, seq = (self._of(slot, column) for column in (KV_LEN, POS0, SEQ))
        hi = _cdiv(jnp.maximum(jnp.minimum(kv_len, pos0 + CTA_ROWS), 0), BLOCK)
        return slot * CTA_ROWS, 0, hi, functools.partial(self._entry, seq)

    def _rows(self, row0):
        """`(seq, kv_len, clean, position of row row0)` of the tile whose output rows hold `row0`."""
        slot = lax.div(row0, jnp.int32(CTA_ROWS))
        seq, kv_len, clean, pos0 = (self._of(slot, column) for column in (SEQ, KV_LEN, CLEAN, POS0))
        return seq, kv_len, clean, pos0 + (row0 - slot * CTA_ROWS)

    def tokens(self, row0):
        """`(token of output row row0, end of its sequence's tokens)`: in place, the rows of q and of the output the
        warpgroup from `row0` reads and writes (it owns those before `end`)."""
        slot = lax.div(row0, jnp.int32(CTA_ROWS))
        return self._of(slot, TOKEN) + (row0 - slot * CTA_ROWS), self._of(slot, END)

    def own(self, row0):
        _, kv_len, clean, q0 = self._rows(row0)
        own_hi = _cdiv(jnp.maximum(jnp.minimum(kv_len, q0 + ROWS), 0), BLOCK)
        seen_by_all = jnp.maximum(jnp.minimum(jnp.minimum(kv_len, clean), q0 + 1), 0)
        full_hi = jnp.minimum(lax.div(seen_by_all, jnp.int32(BLOCK)), own_hi)
        return 0, 0, full_hi, own_hi

    def _entry(self, seq, position):
        """The page-table entry of key `position` of sequence `seq` (a scalar)."""
        return self.tables_ref[seq, lax.div(position, jnp.int32(self.paged.page_size))]

    def mask(self, s, row0, t, fill=MASKED):
        key = wgmma_iota(s.shape, 1)
        seq, kv_len, _, q0 = self._rows(row0)
        k0 = t * BLOCK
        ok = (key - wgmma_iota(s.shape, 0) <= q0 - k0) & (key < kv_len - k0)
        paged = self.paged
        page = lax.div(key, jnp.int32(paged.rows_per_copy))
        for j in range(paged.copies):  # a copy's keys on a page outside the cache: none
            entry = self._entry(seq, k0 + j * paged.rows_per_copy)
            outside = (entry < 0) | (entry >= paged.num_pages)
            ok = ok & (page != jnp.where(outside, jnp.int32(j), jnp.int32(-1)))
        return jnp.where(ok, s, fill)

    def streams(self, k_ref, v_ref, smem, barriers, b, h, entry):
        paged = self.paged
        rows = paged.rows_per_copy
        slot_of = (
            self.kv_head * paged.head_stride + paged.key_offset,
            self.kv_head * paged.head_stride + paged.value_offset,
        )

        def source(ref, slot_row, j):
            def at(i):
                position = i * BLOCK + j * rows
                page = jnp.clip(entry(position), 0, paged.num_pages - 1)
                # (a page of several tiles: step i's place in it, as a multiple of BLOCK the compiler can see)
                offset = 0 if paged.page_size <= BLOCK else lax.rem(i, jnp.int32(paged.page_size // BLOCK)) * BLOCK
                return ref.at[page, pl.ds(offset, rows), slot_row]

            return at

        k_ready, k_consumed, v_ready, v_consumed = barriers
        k_copies, v_copies = (
            tuple((source(ref, slot_row, j), PageRows(buffer, pl.ds(j * rows, rows))) for j in range(paged.copies))
            for ref, slot_row, buffer in zip((k_ref, v_ref), slot_of, smem, strict=True)
        )
        return Stream(k_copies, k_ready, k_consumed), Stream(v_copies, v_ready, v_consumed)


def prefill_tiles(
    st: MosaicGpuFlashStatic, paged: MosaicGpuPagedStatic, batch: PagedBatch, long, long_seqs: int, into=None
):
    """`(out [T, Hq, D], lse [T, Hq] natural log, held [T] bool)` of the sequences `long` ([N] bool, at most
    `long_seqs` of them): the tokens they hold, and what the rows of the others hold (nothing to read). `into`: the
    other sequences' `[T, Hq, D]` output, into which the tiles write theirs in place, reading their queries from the
    batch's rows (no packed copy of the queries, no gather of the rows): `out` is then the batch's."""
    num_tiles = tile_bound(batch.num_tokens, long_seqs, paged.tiles_per_cta)
    meta, order, sources, held = tile_plan(batch, long, num_tiles, packed_rows(batch.num_tokens, long_seqs))
    width = batch.key_rows.shape[1]
    view = lambda rows: rows.reshape(paged.num_pages, paged.page_size, paged.slots, width)
    walk = PagedKeyTiles(st, paged, meta, order, padded_tables(batch, paged.copies), in_place=into is not None)
    k, v, rows = view(batch.key_rows), view(batch.value_rows), num_tiles * CTA_ROWS
    at = jnp.maximum(held, 0)
    if into is None:
        out, lse = forward(st, batch.queries[sources][None], k, v, walk=walk, out_rows=rows)
        out = out[0, at]
    else:
        out, lse = forward(st, batch.queries[None], k, v, walk=walk, out_rows=rows, into=into[None])
        out = out[0]
    return out, lse[0, :, at] * jnp.log(2.0).astype(jnp.float32), held >= 0
