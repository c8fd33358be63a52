"""Paged attention as a Pallas Mosaic TPU kernel: one query tile per row of the grid, one page per step.

The grid is `(query tiles, page steps)`. Both page tables and the tiles' metadata are prefetched as
scalars, so the key/value BlockSpecs' index maps pick step `p`'s physical page of the tile's
sequence (`tables[seq, lo // page_size + p]`): each step DMAs one whole page (every kv head) into
VMEM. Steps past the tile's last page point at that page again (no new DMA) and skip compute, as do
steps whose table entry is not a page of the cache (`page_in_cache`: its DMA is clamped, its keys masked). A
tile's rows are its queries times the query heads of each kv head (`tile_rows`), so a page serves
every head that reads it. The online softmax carries float32 `(acc, m, l)` per kv head in VMEM
scratch, initialised at the first step and written out at the last; `finish_tiles` normalises.

Two page layouts: head-major pages `[pages, Hkv, page_size, D]` (`page_attention`) and slot-major pages
`[pages, page_size, C / packing, packing, D]` with K/V at combined heads `h·head_stride + offset`
(`ragged_page_attention_v3`'s packed cache). Queries are zero-padded to the cache's full row width
(lane-aligned tiles), so the padding columns of a cache must hold finite values (v3 writes zeros).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ejkernel.kernels._common.paged_attention.core_math import adjust_logits, online_softmax_step
from ejkernel.kernels._common.paged_attention.problem import PagedBatch, page_in_cache
from ejkernel.kernels._common.paged_attention.tiles import CONTEXT, FIRST, HI, LO, SEQ

NT_DIMS = (((1,), (1,)), ((), ()))  # a @ b.T


@dataclasses.dataclass(frozen=True)
class Plan:
    block_q: int
    rows: int  # block_q * G, rounded up to a multiple of 8 (sublanes)
    steps: int  # pages a tile may span
    head_major: bool
    packing: int  # slot-major: combined heads per packed group
    interpret: object  # False, or the pltpu.InterpretParams to run with


def page_views(batch: PagedBatch, plan: Plan):
    """The caches with whole pages on their leading axis (the reshapes undo the adapters' row views)."""
    rows = batch.static.rows
    width = batch.key_rows.shape[1]
    if plan.head_major:
        shape = (rows.num_pages, batch.static.num_kv_heads, rows.page_size, width)
    else:
        combined = rows.slot_stride
        shape = (rows.num_pages, rows.page_size, combined // plan.packing, plan.packing, width)
    keys = batch.key_rows.reshape(shape)
    values = None if batch.value_rows is batch.key_rows else batch.value_rows.reshape(shape)
    return keys, values


def _kernel(meta_ref, tables_ref, q_ref, k_ref, *refs, batch_static, plan: Plan, group: int, shared: bool):
    st, layout = batch_static, batch_static.rows
    refs = list(refs)
    v_ref = k_ref if shared else refs.pop(0)
    acc_out, m_out, l_out, acc_s, m_s, l_s = refs
    tile, step = pl.program_id(0), pl.program_id(1)
    lo, hi = meta_ref[tile, LO], meta_ref[tile, HI]
    context, first = meta_ref[tile, CONTEXT], meta_ref[tile, FIRST]
    first_page = lo // layout.page_size
    page = first_page + step
    entry = tables_ref[meta_ref[tile, SEQ], jnp.minimum(page, tables_ref.shape[1] - 1)]

    @pl.when(step == 0)
    def _init():
        acc_s[...] = jnp.zeros(acc_s.shape, jnp.float32)
        m_s[...] = jnp.full(m_s.shape, -jnp.inf, jnp.float32)
        l_s[...] = jnp.zeros(l_s.shape, jnp.float32)

    def head_rows(ref, head: int, offset: int):
        if plan.head_major:
            return ref[head]
        combined = head * layout.head_stride + offset
        return ref[:, combined // plan.packing, combined % plan.packing, :]

    @pl.when((hi > lo) & (page * layout.page_size < hi) & page_in_cache(entry, layout.num_pages))
    def _attend():
        shape = (plan.rows, layout.page_size)
        q_pos = context + first + lax.broadcasted_iota(jnp.int32, shape, 0) // group
        k_pos = page * layout.page_size + lax.broadcasted_iota(jnp.int32, shape, 1)
        for h in range(st.num_kv_heads):
            q = q_ref[h]
            k = head_rows(k_ref, h, layout.key_offset).astype(q.dtype)
            v = head_rows(v_ref, h, layout.value_offset).astype(q.dtype)
            s = lax.dot_general(q, k, NT_DIMS, preferred_element_type=jnp.float32) * st.softmax_scale
            s = adjust_logits(s, q_pos, k_pos, lo, hi, st)
            weigh_values = lambda p, v=v: jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
            acc, m, denom = online_softmax_step((acc_s[h], m_s[h], l_s[h]), s, weigh_values, detach=lambda x: x)
            acc_s[h], m_s[h], l_s[h] = acc, m, denom

    @pl.when(step == plan.steps - 1)
    def _write():
        acc_out[...] = acc_s[...]
        m_out[...] = m_s[...]
        l_out[...] = l_s[...]


def partial_sums(batch: PagedBatch, meta, q_tiles, plan: Plan):
    """`(acc [1, R, Hkv, rows, W], m, l [1, R, Hkv, rows])` of the tiles (one split), float32."""
    st, layout = batch.static, batch.static.rows
    num_tiles, num_kv_heads, rows, width = q_tiles.shape
    keys, values = page_views(batch, plan)
    table_width = batch.page_tables.shape[1]

    def page_index(tile, step, meta_ref, tables_ref):
        lo, hi = meta_ref[tile, LO], meta_ref[tile, HI]
        first_page = lo // layout.page_size
        last_page = jnp.maximum((hi - 1) // layout.page_size, first_page)
        column = jnp.clip(jnp.minimum(first_page + step, last_page), 0, table_width - 1)
        page = jnp.clip(tables_ref[meta_ref[tile, SEQ], column], 0, layout.num_pages - 1)
        return (page,) + (0,) * (keys.ndim - 1)

    page_spec = pl.BlockSpec((None, *keys.shape[1:]), page_index)
    tile_spec = pl.BlockSpec((None, num_kv_heads, rows, width), lambda r, p, *_: (r, 0, 0, 0))
    stats_spec = pl.BlockSpec((None, num_kv_heads, rows), lambda r, p, *_: (r, 0, 0))
    in_specs = [tile_spec, page_spec] + ([] if values is None else [page_spec])
    kernel = functools.partial(
        _kernel, batch_static=st, plan=plan, group=batch.num_heads // num_kv_heads, shared=values is None
    )
    stats = (num_tiles, num_kv_heads, rows)
    acc, m, denom = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(num_tiles, plan.steps),
            in_specs=in_specs,
            out_specs=[tile_spec, stats_spec, stats_spec],
            scratch_shapes=[
                pltpu.VMEM((num_kv_heads, rows, width), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows), jnp.float32),
            ],
        ),
        out_shape=[
            jax.ShapeDtypeStruct((*stats, width), jnp.float32),
            jax.ShapeDtypeStruct(stats, jnp.float32),
            jax.ShapeDtypeStruct(stats, jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=plan.interpret,
        name="ejkernel_paged_attention_tpu",
    )(meta, batch.page_tables, q_tiles, keys, *([] if values is None else [values]))
    return acc[None], m[None], denom[None]
