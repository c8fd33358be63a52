"""MLA over a paged latent cache as one Pallas-Triton kernel: rows of (query token, head) against shared latent rows.

Every query head scores against the same cache rows `[c (L), 0..., r (R), 0...]` (one latent head), so a
program takes `block_h` query rows of one tile (`_common.paged_attention.tiles`: `block_q` queries of one
sequence, row `i * Hq + h`; with 128 heads, one token's heads per tile and two programs per token) and
streams the tile's cache rows through an online softmax: each step gathers `block_k` rows, as `c [block_k,
Lp]` and `r [block_k, Rp]` (the latent and RoPE parts, padded to powers of two, the row's zero padding
never read), scores `q_nope·c + q_pe·r` and accumulates `p @ c` in a float32 `[block_h, Lp]` tile: the
latent rows are keys and values, read once per program. A quantised cache is read as stored and converted in
registers; with per-row scales each step loads its `block_k` scales and multiplies the logits' columns, and the
probabilities before `p @ c`, by them. The programs of a tile's rows run side by side
(the row block is the grid's fastest axis), so their shared cache rows come from L2 after the first read.

A program walks its share of the key positions its tile may see (`key_span`: causal, sliding window), cut
in `num_splits` parts for long contexts with few programs
(flash-decoding); each part writes its unnormalised sums, running max and denominator, and the shared
`finalize` merges the parts by log-sum-exp. Exponentials are base 2 (`exp2`); the running max is written
back in natural units, as `finalize` reads it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.attention import LOG2E
from ejkernel.kernels._common.paged_attention.core_math import adjust_logits, online_softmax_step
from ejkernel.kernels._common.paged_attention.problem import PagedBatch, PagedStatic, page_in_cache
from ejkernel.kernels._common.paged_attention.tiles import CONTEXT, FIRST, HI, LO, SEQ
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._helpers import dot, exp2


@dataclasses.dataclass(frozen=True)
class TritonLatentPagedStatic:
    """The latent problem's widths and heads: the parts of a cache row the kernel reads."""

    latent: int  # L: the latent row c, columns [0, L)
    rope: int  # R: the RoPE key r, columns [rope_col, rope_col + R); 0: none
    rope_col: int
    num_heads: int

    @property
    def latent_tile(self) -> int:
        return max(16, pl.next_power_of_2(self.latent))

    @property
    def rope_tile(self) -> int:
        return max(16, pl.next_power_of_2(self.rope)) if self.rope else 0


@dataclasses.dataclass(frozen=True)
class TritonLatentPagedTiling:
    """The kernel's tiles, key splits and Triton settings."""

    block_q: int  # queries per tile
    rows: int  # a tile's query rows: block_q * Hq rounded up to a power of two
    block_h: int  # query rows per program (divides rows)
    block_k: int  # cache rows per step
    num_splits: int
    num_warps: int
    num_stages: int
    interpret: bool


def _kernel(meta_ref, tables_ref, q_ref, cache_ref, *refs, st, dims, t, scaled: bool):
    scales_ref = refs[0] if scaled else None
    acc_ref, m_ref, l_ref = refs[1:] if scaled else refs
    block, tile, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    layout, heads = st.rows, dims.num_heads
    seq, lo, hi = meta_ref[tile, SEQ], meta_ref[tile, LO], meta_ref[tile, HI]
    context, first = meta_ref[tile, CONTEXT], meta_ref[tile, FIRST]
    rows = block * t.block_h + jnp.arange(t.block_h, dtype=jnp.int32)
    q_pos = context + first + lax.div(rows, jnp.int32(heads))

    # This split's key blocks: the span's blocks cut in `num_splits` near-equal runs.
    block_k = jnp.int32(t.block_k)
    first_block = lax.div(jnp.maximum(lo, 0), block_k)
    last_block = jnp.where(hi > lo, lax.div(hi + (t.block_k - 1), block_k), first_block)
    per_split = lax.div(last_block - first_block + (t.num_splits - 1), jnp.int32(t.num_splits))
    start = first_block + split * per_split
    stop = jnp.minimum(start + per_split, last_block)

    def columns(offset: int, width: int, tile: int):
        """Column indices `offset + [0, tile)` of a row, and the mask of the `width` real ones (None: all)."""
        cols = offset + jnp.arange(tile, dtype=jnp.int32)
        return cols[None, :], (None if tile == width else (cols < offset + width)[None, :])

    latent_cols = columns(0, dims.latent, dims.latent_tile)
    rope_cols = columns(dims.rope_col, dims.rope, dims.rope_tile) if dims.rope else None

    def read(ref, row, cols):
        index, mask = cols
        at = ref.at[row[:, None], index]
        zero = 0 if jnp.issubdtype(ref.dtype, jnp.integer) else 0.0  # the fill in the cache's kind
        return plgpu.load(at) if mask is None else plgpu.load(at, mask=mask, other=zero)

    q_rows = tile * t.rows + rows
    q_latent = read(q_ref, q_rows, latent_cols)
    q_rope = read(q_ref, q_rows, rope_cols) if dims.rope else None

    def lookup(b, pos):
        """The cache rows of positions `pos` (block `b`), and whether their page is in the cache."""
        if layout.page_size % t.block_k == 0:  # the block lies on one page: one table entry
            entry = tables_ref[seq, lax.div(b * block_k, jnp.int32(layout.page_size))]
            page = jnp.clip(entry, 0, layout.num_pages - 1)
            return page * layout.page_size + lax.rem(pos, jnp.int32(layout.page_size)), page_in_cache(
                entry, layout.num_pages
            )
        column = jnp.clip(lax.div(pos, jnp.int32(layout.page_size)), 0, tables_ref.shape[1] - 1)
        entry = plgpu.load(tables_ref.at[seq, column])
        page = jnp.clip(entry, 0, layout.num_pages - 1)
        row = page * layout.page_size + lax.rem(pos, jnp.int32(layout.page_size))
        return row, page_in_cache(entry, layout.num_pages)[None, :]

    def step(b, carry):
        pos = b * block_k + jnp.arange(t.block_k, dtype=jnp.int32)
        row, key_ok = lookup(b, pos)
        latent = read(cache_ref, row, latent_cols).astype(q_latent.dtype)
        s = dot(q_latent, latent, trans_b=True)
        if dims.rope:
            s = s + dot(q_rope, read(cache_ref, row, rope_cols).astype(q_rope.dtype), trans_b=True)
        s = s * st.softmax_scale
        row_scales = plgpu.load(scales_ref.at[row])[None, :] if scaled else None
        if scaled:
            s = s * row_scales
        s = adjust_logits(s, q_pos[:, None], pos[None, :], lo, hi, st, None, key_ok) * LOG2E
        return online_softmax_step(
            carry,
            s,
            lambda p: dot((p if row_scales is None else p * row_scales).astype(latent.dtype), latent),
            exp=functools.partial(exp2, interpret=t.interpret),
            detach=lambda x: x,
        )

    carry = (
        jnp.zeros((t.block_h, dims.latent_tile), jnp.float32),
        jnp.full((t.block_h,), -jnp.inf, jnp.float32),
        jnp.zeros((t.block_h,), jnp.float32),
    )
    acc, m, denom = lax.fori_loop(start, stop, step, carry)
    acc_ref[...] = acc
    m_ref[...] = m / LOG2E  # natural units (-inf stays -inf)
    l_ref[...] = denom


def partial_sums(batch: PagedBatch, dims: TritonLatentPagedStatic, meta, q_rows, t: TritonLatentPagedTiling):
    """Each split's `(acc [S, R, rows, Lp], m, l [S, R, rows])` (float32) of the tiles `meta [R, 5]`.

    `q_rows [R * rows, width]` are the tiles' query rows (`[q_nope, 0..., q_pe, 0...]`, the cache row's
    layout), `batch.key_rows [pages * page_size, width]` the updated cache and `batch.key_scales` its per-row
    scales or None.
    """
    st: PagedStatic = batch.static
    num_tiles = meta.shape[0]
    scaled = batch.key_scales is not None
    args = [meta, batch.page_tables, q_rows, batch.key_rows] + ([batch.key_scales] if scaled else [])
    whole = lambda x: pl.BlockSpec(x.shape, lambda h, r, s: (0,) * x.ndim)
    grid = (t.rows // t.block_h, num_tiles, t.num_splits)
    stats = (t.num_splits, num_tiles, t.rows)
    return pl.pallas_call(
        functools.partial(_kernel, st=st, dims=dims, t=t, scaled=scaled),
        grid=grid,
        in_specs=[whole(x) for x in args],
        out_specs=[
            pl.BlockSpec((None, None, t.block_h, dims.latent_tile), lambda h, r, s: (s, r, h, 0)),
            pl.BlockSpec((None, None, t.block_h), lambda h, r, s: (s, r, h)),
            pl.BlockSpec((None, None, t.block_h), lambda h, r, s: (s, r, h)),
        ],
        out_shape=[
            out_struct((*stats, dims.latent_tile), jnp.float32, *args),
            out_struct(stats, jnp.float32, *args),
            out_struct(stats, jnp.float32, *args),
        ],
        compiler_params=plgpu.CompilerParams(num_warps=t.num_warps, num_stages=t.num_stages),
        interpret=t.interpret,
        name="ejkernel_mla_paged_attention",
    )(*args)
