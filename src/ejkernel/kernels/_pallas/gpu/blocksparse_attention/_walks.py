"""What the Mosaic GPU flash attention kernels need to run block-sparse: which tiles to stream, and the mask.

The kernels (`flash_attention._fwd`, `_bwd`) take a walk: for each query tile (forward, dQ) the key
tiles it streams and, for each key CTA (dK/dV, fused backward), the query tiles of each head of its
group. Flash attention's walks stream contiguous runs of tiles; these stream what the block table
lists: its full blocks (no mask work) and its partial ones (masked: positional rules, key length,
segment ids read from global memory), the forward and dQ the full ones first (`run_segments` says
why), dK/dV in the table's order, partial ones first. A table without partial blocks traces no
masked step at all (`MosaicGpuBlockSparseStatic.partial_tiles`). A table block of `table_k` keys is
`table_k / block` steps of the kernel's `block`-row tiles, in order.

CTAs run their tiles longest list first (`launch_order`): the GPU starts CTAs in launch order as SMs
free up, so the last ones to start are short and few SMs idle at the end (H200, S=16384 H=16 D=128,
random blocks, forward+backward at 10% / 25%: 1.872 / 4.004 ms against 1.922 / 4.246 in tile order).

Table rows are packed for the kernels, which read them as scalars from global memory:

- forward / dQ, per `(Bt, Ht, query block)`: `[count, edges, key block...]`;
- dK/dV, per `(Bt, Hkv or 1, key block)`: `[first_0 .. first_G, edges_0 .. edges_{G-1}, entry...]`:
  the G query heads of the key/value head, one after another; head g's blocks are entries
  `[first_g, first_{g+1})` (its `edges_g` partial ones first), each entry `g * nQ + query block`.
  The memory warpgroup streams the entries in order, and the compute warpgroups count their steps
  with it, so a step's slot is its index in that stream.

Plain `jnp`/`numpy` and the flash attention's `_tiling`: importable without loading Mosaic GPU.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ejkernel.kernels._common.attention import round_up
from ejkernel.kernels._common.sparse_attention.block_table import BlockTable
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import CTA_ROWS, MosaicGpuFlashStatic, allowed


@dataclasses.dataclass(frozen=True)
class MosaicGpuBlockSparseStatic(MosaicGpuFlashStatic):
    """Flash attention's `MosaicGpuFlashStatic` (layout `[B, H, S, D]`) and what block-sparse calls add (hashable)."""

    chunk_size: int | None = None  # query i sees key j only if i // c == j // c
    table_q: int = CTA_ROWS  # the block table's tiles: a multiple of 128 rows / keys
    table_k: int = CTA_ROWS
    table_batch: bool = False  # the table differs per batch row / per query head (else one for all)
    table_heads: bool = False
    segments: bool = False  # query i sees key j only if their segment ids are equal and >= 0
    partial_tiles: bool = True  # the table lists tiles that need a mask (else the kernels trace no masked step)

    @property
    def kv_len_padded(self) -> int:
        return round_up(self.kv_len, self.table_k)

    @property
    def q_len_padded(self) -> int:
        return round_up(self.q_len, self.table_q)


# ---- the lists, packed ----


def concrete(*arrays) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in arrays)


def _xp(*arrays):
    """numpy for a table known while tracing (its lists are then constants), else jax.numpy."""
    return np if concrete(*arrays) else jnp


def row_lists(table: BlockTable):
    """`[Bt, Ht, nQ, 2 + W]` int32 rows `[count, edges, key block...]` (numpy when the table is concrete)."""
    xp = _xp(table.kv_blocks, table.kv_counts, table.kv_edges)
    counts, edges = xp.asarray(table.kv_counts)[..., None], xp.asarray(table.kv_edges)[..., None]
    return xp.concatenate([counts, edges, xp.asarray(table.kv_blocks)], axis=-1).astype(np.int32)


def column_lists(table: BlockTable, group: int):
    """`[Bt, Hkv or 1, nK, 2G + 1 + G·W]` int32 rows of the key CTAs (module docstring)."""
    xp = _xp(table.q_blocks, table.q_counts, table.q_edges)
    blocks, counts, edges = (xp.asarray(x) for x in (table.q_blocks, table.q_counts, table.q_edges))
    bt, ht, _, width = blocks.shape
    n_q = table.num_q_blocks

    def per_group(x):  # [Bt, Ht, nK, ...] -> [Bt, Ht / G or 1, nK, G, ...]
        if ht == 1:
            x = x[:, :, :, None]
            return xp.broadcast_to(x, (*x.shape[:3], group, *x.shape[4:]))
        x = x.reshape(bt, ht // group, group, *x.shape[2:])
        return xp.moveaxis(x, 2, 3)

    blocks, counts, edges = per_group(blocks), per_group(counts), per_group(edges)
    zero = xp.zeros((*counts.shape[:-1], 1), np.int32)
    first = xp.concatenate([zero, xp.cumsum(counts, axis=-1).astype(np.int32)], axis=-1)  # [..., G + 1]
    p = xp.arange(group * width, dtype=np.int32)
    head = xp.minimum((first[..., 1:, None] <= p).sum(axis=-2), group - 1).astype(np.int32)  # [..., G·W]
    j = xp.clip(p - xp.take_along_axis(first, head, axis=-1), 0, width - 1)
    flat = blocks.reshape(*blocks.shape[:-2], group * width)
    entry = xp.take_along_axis(flat, head * width + j, axis=-1) + head * n_q
    entry = xp.where(p < first[..., -1:], entry, 0)
    return xp.concatenate([first, edges, entry], axis=-1).astype(np.int32)


def launch_order(counts, per_tile: int):
    """`[Bt, Ht, tiles]` int32: the 128-row tile of each CTA in launch order, most listed steps first.

    `counts [Bt, Ht, n]`: the steps of each table tile, which spans `per_tile` 128-row tiles.
    """
    xp = _xp(counts)
    steps = xp.repeat(xp.asarray(counts), per_tile, axis=-1)
    order = jnp.argsort(-steps, axis=-1, stable=True) if xp is jnp else np.argsort(-steps, axis=-1, kind="stable")
    return order.astype(np.int32)


# ---- the mask of a partial tile ----


def sparse_masked_scores(
    st: MosaicGpuBlockSparseStatic, s, row0, col0, *, transposed: bool = False, fill, segments=None
):
    """`s` with the pairs the positional rules, the padded keys and the segment ids forbid set to `fill`.

    As `flash_attention._parts.masked_scores`, with the chunked rule and segments besides; `transposed`
    tiles are [key, query]; `row0`, `col0` are the absolute positions of the tile's first row and
    column; `segments`: the ids of the tile's rows and of its columns (vectors in the WGMMA layouts).
    """
    from ejkernel.kernels._pallas.gpu.flash_attention._parts import along_cols, along_rows, wgmma_iota

    q_axis, k_axis, q0, k0 = (1, 0, col0, row0) if transposed else (0, 1, row0, col0)
    key = wgmma_iota(s.shape, k_axis)
    query = wgmma_iota(s.shape, q_axis)
    tests = []
    ok = allowed(st, key - query, key, q0, k0)
    if ok is not None:
        tests.append(ok)
    if st.chunk_size is not None:
        c = jnp.int32(st.chunk_size)
        tests.append(lax.div(query + q0, c) == lax.div(key + k0, c))
    if segments is not None:
        rows, cols = along_rows(segments[0], s.shape), along_cols(segments[1], s.shape)
        tests.append((rows == cols) & ((cols if transposed else rows) >= 0))
    return jnp.where(functools.reduce(operator.and_, tests), s, fill) if tests else s


# ---- the walks ----


def _walk_classes():
    """The walk classes, which subclass the kernels' (defined here on first use: those load Mosaic GPU)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from ejkernel.kernels._pallas.gpu.flash_attention._parts import (
        MASKED,
        ROWS,
        KeyTiles,
        QueryTiles,
    )

    def segment_ids(ref, b, start, size: int, axis: int):
        """Ids of positions [start, start + size) of batch row b, laid out along axis `axis` of a tile."""
        return plgpu.load(ref.at[b, pl.ds(start, size)], layout=plgpu.Layout.WGMMA.reduce(1 - axis), optimized=False)

    def bind(walk, refs, b, h):
        bound = copy.copy(walk)
        bound.ref, bound.order_ref, *bound.segment_refs = refs
        bound.batch = b
        bound.at = (b if walk.st.table_batch else 0, h if walk.st.table_heads else 0)
        return bound

    class ListedKeyTiles(KeyTiles):
        """Forward / dQ: each 128-row query tile streams the key blocks its table row lists."""

        def __init__(
            self,
            st: MosaicGpuBlockSparseStatic,
            block: int,
            lists,
            order,
            num_q_tiles: int,
            segments=(),
            tiles_per_cta=1,
        ):
            super().__init__(st, block, 0, num_q_tiles, tiles_per_cta)
            self.masked = st.partial_tiles
            self.per_block = st.table_k // block
            self.arrays = (lists, order, *segments)

        def bind(self, refs, b, h):
            return bind(self, refs, b, h)

        def _entry(self, row, i):
            return self.ref[(*self.at, lax.div(row, jnp.int32(self.st.table_q)), i)]

        def row(self, cta, j):  # longest first; two per CTA: the cta-th longest and the cta-th shortest
            launched = jnp.where(j == 0, cta, self.num_q_tiles - 1 - cta)
            return self.order_ref[(*self.at, launched)] * CTA_ROWS

        def _counts(self, row):
            """(listed blocks, partial ones among them) of the query tile holding `row`."""
            return self._entry(row, 0), self._entry(row, 1)

        def key_row(self, row, t, counts=None):
            """First key row of step t of the query tile holding `row` (`counts`: its `_counts`, if read).

            The steps take the full blocks first and the partial ones last (the table lists them the
            other way round): see `run_segments` on why masked steps come last.
            """
            n = jnp.int32(self.per_block)
            entry = t if self.per_block == 1 else lax.div(t, n)
            if self.masked:
                listed, partial = self._counts(row) if counts is None else counts
                full = listed - partial
                entry = jnp.where(entry < full, entry + partial, entry - full)
            first = self._entry(row, 2 + entry) * self.st.table_k
            return first if self.per_block == 1 else first + lax.rem(t, n) * self.block

        def tile(self, cta, j):
            row = self.row(cta, j)
            counts = self._counts(row)
            return row, 0, counts[0] * self.per_block, lambda i: self.key_row(row, i, counts)

        def own(self, row0):
            listed, partial = self._counts(row0)
            return 0, 0, (listed - partial) * self.per_block, listed * self.per_block

        def mask(self, s, row0, t, fill=MASKED):
            col0 = self.key_row(row0, t)
            segments = None
            if self.st.segments:
                q_seg, kv_seg = self.segment_refs
                rows = segment_ids(q_seg, self.batch, row0, s.shape[0], 0)
                segments = rows, segment_ids(kv_seg, self.batch, col0, s.shape[1], 1)
            return sparse_masked_scores(self.st, s, row0, col0, fill=fill, segments=segments)

    class ListedQueryTiles(QueryTiles):
        """dK/dV, fused backward: each 128-key CTA streams, head after head of its group, the query
        blocks its table column lists (`column_lists`)."""

        def __init__(self, st: MosaicGpuBlockSparseStatic, block: int, lists, order, num_q_blocks: int, segments=()):
            super().__init__(st, block, 0)
            self.masked = st.partial_tiles
            self.per_block, self.num_q_blocks = st.table_q // block, num_q_blocks
            self.arrays = (lists, order, *segments)

        def bind(self, refs, b, kv_h):
            return bind(self, refs, b, kv_h)

        def key_tile(self, cta):
            return self.order_ref[(*self.at, cta)]

        def _entry(self, kb, i):
            return self.ref[(*self.at, kb, i)]

        def span(self, cta_col):
            return lax.div(cta_col, jnp.int32(self.st.table_k))

        def _steps(self, x):
            return x * self.per_block

        def _head_and_row(self, kb, t):
            """(head within the group, first query row) of stream step t."""
            n = jnp.int32(self.per_block)
            group = self.st.group
            e = self._entry(kb, 2 * group + 1 + (t if self.per_block == 1 else lax.div(t, n)))
            if group == 1:
                g, block = 0, e
            else:
                g = lax.div(e, jnp.int32(self.num_q_blocks))
                block = e - g * self.num_q_blocks
            row = block * self.st.table_q
            return g, row if self.per_block == 1 else row + lax.rem(t, n) * self.block

        def position(self, kb, kv_h, i):
            g, row = self._head_and_row(kb, i)
            return kv_h * self.st.group + g, row

        def total(self, kb):
            return self._steps(self._entry(kb, self.st.group))

        def prepare(self, kb, col0):
            return None

        def head(self, kb, own, g):
            lo, hi = self._steps(self._entry(kb, g)), self._steps(self._entry(kb, g + 1))
            full = lo + self._steps(self._entry(kb, self.st.group + 1 + g))
            return lo, (lo, full, hi, hi), hi, lambda t: lax.rem(t, jnp.int32(self.st.stages_bwd))

        def query_row(self, kb, t):
            return self._head_and_row(kb, t)[1]

        def mask(self, s, col0, kb, t):
            row0 = self.query_row(kb, t)
            segments = None
            if self.st.segments:
                q_seg, kv_seg = self.segment_refs
                keys = segment_ids(kv_seg, self.batch, col0, ROWS, 0)
                segments = keys, segment_ids(q_seg, self.batch, row0, s.shape[1], 1)
            return sparse_masked_scores(self.st, s, col0, row0, transposed=True, fill=0.0, segments=segments)

    return ListedKeyTiles, ListedQueryTiles


@functools.cache
def walk_classes():
    return _walk_classes()


def key_tiles(
    st: MosaicGpuBlockSparseStatic, block: int, lists, order, num_q_tiles: int, segments=(), tiles_per_cta: int = 1
):
    """The forward's / dQ kernel's walk: `lists` from `row_lists`, `order` the query tiles' `launch_order`,
    `segments` the padded (q, kv) ids or (); `tiles_per_cta`: query tiles per CTA
    (`MosaicGpuFlashStatic.q_tiles_per_cta`)."""
    return walk_classes()[0](st, block, lists, order, num_q_tiles, segments, tiles_per_cta)


def query_tiles(st: MosaicGpuBlockSparseStatic, block: int, lists, order, num_q_blocks: int, segments=()):
    """The dK/dV (fused backward) kernel's walk: `lists` from `column_lists`, `order` the key tiles'
    `launch_order`, `segments` as in `key_tiles`."""
    return walk_classes()[1](st, block, lists, order, num_q_blocks, segments)
