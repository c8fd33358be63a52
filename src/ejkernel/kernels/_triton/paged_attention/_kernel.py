"""The serving ops' attention as one Pallas-Triton kernel: split-K paged attention over query tiles.

One program per (query tile, kv head, split). A query tile is `block_q` queries of one sequence; its
rows are those queries times the `G = Hq / Hkv` query heads that read the program's kv head (row
`i * G + g`), so every key/value row loaded serves all of them: grouped-query attention reads each
page once. The program walks its split of the tile's key span (`key_span`) in steps of `block_k`
positions: per position it looks up the page in the sequence's page table and gathers the key and
value rows of its kv head straight from the cache, whatever the op's layout (`CacheRows`); a position
whose table entry is not a page of the cache is read clamped and masked (`page_in_cache`). Logits
get the soft cap, ALiBi, query-query bias and masks of `adjust_logits`; an online softmax keeps
float32 running sums. Each split writes its unnormalised sums, running max and denominator, and
`finalize` merges the splits by log-sum-exp (flash-decoding) and joins the sinks. Exponentials are base 2
(`exp2`: one `ex2.approx` where `jnp.exp` is libdevice's several instructions); the running max is written in
natural units.

A quantised cache (float8, int8) is loaded as stored and converted in registers (int8 keys read by 16-bit
queries are not: they meet int8-rounded queries in an integer dot, `_queries`); with per-row scales,
each step also loads its `block_k` key and value scales and multiplies the logits' columns by the key
scales and the probabilities by the value scales before `p @ v`.

Tile metadata (sequence, key span, context) is computed outside the kernel in plain jnp.
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
class TritonPagedTiling:
    """The partial-sums kernel's tiles, key splits and Triton settings."""

    block_q: int  # queries per tile
    block_k: int  # key positions per step
    rows: int  # block_q * G, rounded up to a power of two >= 16
    width: int  # head dim rounded up to a power of two >= 16
    num_splits: int
    num_warps: int
    num_stages: int
    interpret: bool


def _queries(q, cache_dtype, softmax_scale: float):
    """The query tile as the logits' dot takes it, and the logits' scale (per row `[rows, 1]`, or a float).

    An 8-bit cache read by 16-bit queries computes in narrower types (float32 queries keep float32 dots), its value
    rows widened to float16 (`widen`):
    - int8 codes meet int8 queries, each row rounded to 127 steps of its largest magnitude, in an integer dot
      (exact in int32): the key rows are never widened. On an H200 the int8 decode went from 1.15x to 1.29x the
      speed of a bf16 cache, its error against the bf16 result from 9.7e-3 to 1.17e-2 (BENCHMARKS.md, session 45).
      (`scaled_codes.quantize_rows` rounds the same way, but by `jnp.round`, which Pallas-Triton does not lower.)
    - float8 codes widen to float16, which holds every float8 code exactly, in one hardware conversion per pair
      (widened to bfloat16, an H200's float8 decode took 0.68 ms against 0.60 in float16). bfloat16 queries enter
      float16 divided by a power of two that brings their row's largest magnitude under 2**14 (exact; the logits
      are multiplied back), so no query overflows float16's range.
    """
    integer = cache_dtype == jnp.int8
    narrowed = (jnp.bfloat16, jnp.float16) if integer else (jnp.bfloat16,)  # float16 queries meet float8 as they are
    if jnp.dtype(cache_dtype).itemsize != 1 or q.dtype not in narrowed:
        return q, softmax_scale
    wide = q.astype(jnp.float32)
    largest = jnp.max(jnp.abs(wide), axis=1, keepdims=True)
    if integer:
        step = jnp.where(largest > 0, largest * (1.0 / 127.0), 1.0)
        return jnp.floor(wide * (1.0 / step) + 0.5).astype(jnp.int8), step * softmax_scale
    shift = jnp.where(largest > 2.0**14, jnp.exp2(jnp.ceil(jnp.log2(largest * 2.0**-14))), 1.0)
    return (wide / shift).astype(jnp.float16), shift * softmax_scale


def widen(codes, dtype):
    """Cache rows as loaded -> `dtype`. int8 codes widen to float16 through float16's bits: `code + 0x6480` is
    the float16 `1152 + code` (exact: 1024 <= it < 2048, where float16's step is 1), minus 1152. Integer adds run
    at four times the rate of the hardware's integer-to-float conversion (on an H200 the int8 decode went from
    1.00x to 1.08x the speed of a bf16 cache; BENCHMARKS.md, session 44)."""
    if codes.dtype == jnp.int8 and dtype == jnp.float16:
        shifted = codes.astype(jnp.int16) + jnp.int16(0x6480)
        return lax.bitcast_convert_type(shifted, jnp.float16) - jnp.float16(1152)
    return codes.astype(dtype)


def _kernel(
    meta_ref,
    tables_ref,
    q_ref,
    k_ref,
    v_ref,
    *refs,
    st: PagedStatic,
    t: TritonPagedTiling,
    group: int,
    alibi: bool,
    qq: bool,
    scaled: bool,
):
    refs = list(refs)
    alibi_ref = refs.pop(0) if alibi else None
    qq_ref = refs.pop(0) if qq else None
    ks_ref, vs_ref = (refs.pop(0), refs.pop(0)) if scaled else (None, None)
    acc_ref, m_ref, l_ref = refs
    tile, head, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    layout = st.rows
    seq, lo, hi = meta_ref[tile, SEQ], meta_ref[tile, LO], meta_ref[tile, HI]
    context, first = meta_ref[tile, CONTEXT], meta_ref[tile, FIRST]
    q_index = first + lax.div(jnp.arange(t.rows, dtype=jnp.int32), jnp.int32(group))  # query within its sequence
    q_pos = (context + q_index)[:, None]
    cols = jnp.arange(t.width, dtype=jnp.int32)
    col_ok = None if st.head_dim == t.width else (cols < st.head_dim)[None, :]  # (no mask: plain row loads)

    # This split's key blocks: the span's blocks cut in `num_splits` near-equal runs.
    block_k = jnp.int32(t.block_k)
    first_block = lax.div(lo, block_k)
    last_block = jnp.where(hi > lo, lax.div(hi + (t.block_k - 1), block_k), first_block)
    per_split = lax.div(last_block - first_block + (t.num_splits - 1), jnp.int32(t.num_splits))
    start = first_block + split * per_split
    stop = jnp.minimum(start + per_split, last_block)

    q, logit_scale = _queries(q_ref[...], k_ref.dtype, st.softmax_scale)
    value_dtype = jnp.float16 if q.dtype == jnp.int8 else q.dtype  # int8 keys in integer dots, values in float16
    slopes = alibi_ref[...] if alibi else None
    head_row = head * layout.head_stride

    def lookup(pos):
        """This program's first cache rows of positions `pos` of the tile's sequence, and whether their page is
        in the cache."""
        column = jnp.clip(lax.div(pos, jnp.int32(layout.page_size)), 0, tables_ref.shape[1] - 1)
        entry = plgpu.load(tables_ref.at[seq, column])
        page = jnp.clip(entry, 0, layout.num_pages - 1)
        row = page * layout.page_stride + lax.rem(pos, jnp.int32(layout.page_size)) * layout.slot_stride
        return row + head_row, page_in_cache(entry, layout.num_pages)

    def read(rows_ref, row, dtype):
        """Rows `row [block_k]` of a cache -> `[block_k, width]` of `dtype`."""
        zero = 0 if jnp.issubdtype(rows_ref.dtype, jnp.integer) else 0.0  # the fill in the cache's kind
        at = rows_ref.at[row[:, None], cols[None, :]]
        return widen(plgpu.load(at) if col_ok is None else plgpu.load(at, mask=col_ok, other=zero), dtype)

    def step(b, carry):
        pos = b * t.block_k + jnp.arange(t.block_k, dtype=jnp.int32)
        row, key_ok = lookup(pos)
        if scaled:  # loaded with the rows, before the first dot (not queued behind it)
            k_scales = plgpu.load(ks_ref.at[row + layout.key_offset])[None, :]
            v_scales = plgpu.load(vs_ref.at[row + layout.value_offset])[None, :]
        else:
            v_scales = None
        k = read(k_ref, row + layout.key_offset, q.dtype)
        s = dot(q, k, trans_b=True).astype(jnp.float32) * logit_scale
        if scaled:
            s = s * k_scales
        rel = (pos - context)[None, :]
        bias = None if slopes is None else slopes[:, None] * rel.astype(jnp.float32)
        if qq:
            size = qq_ref.shape[0]
            inside = (q_index[:, None] < size) & (rel >= 0) & (rel < size)
            index = (jnp.clip(q_index, 0, size - 1)[:, None], jnp.clip(rel, 0, size - 1))
            tile_qq = plgpu.load(qq_ref.at[index], mask=inside, other=0.0).astype(jnp.float32)
            bias = tile_qq if bias is None else bias + tile_qq
        s = adjust_logits(s, q_pos, pos[None, :], lo, hi, st, bias, key_ok[None, :]) * LOG2E

        def weigh_values(p):
            """`p @ v`, its value rows read here, after the softmax: an 8-bit cache's rows are widened in registers,
            and read beside the keys their widened tile stayed live across the first dot and the softmax (an H200's
            int8 decode: 1.10x -> 1.16x a bf16 cache)."""
            v = read(v_ref, row + layout.value_offset, value_dtype)
            return dot((p if v_scales is None else p * v_scales).astype(v.dtype), v)

        return online_softmax_step(
            carry, s, weigh_values, exp=functools.partial(exp2, interpret=t.interpret), detach=lambda x: x
        )

    carry = (
        jnp.zeros((t.rows, t.width), jnp.float32),
        jnp.full((t.rows,), -jnp.inf, jnp.float32),
        jnp.zeros((t.rows,), jnp.float32),
    )
    acc, m, denom = lax.fori_loop(start, stop, step, carry)
    acc_ref[...] = acc
    m_ref[...] = m / LOG2E  # natural units (-inf stays -inf)
    l_ref[...] = denom


def partial_sums(batch: PagedBatch, meta, q_tiles, alibi_rows, t: TritonPagedTiling):
    """Each split's `(acc [S, R, Hkv, rows, width], m, l [S, R, Hkv, rows])` (float32).

    `meta [R, 5]` int32 (sequence, key span lo / hi, context, first query of each tile), `q_tiles
    [R, Hkv, rows, width]` the tiles' query rows, `alibi_rows [Hkv, rows]` their ALiBi slopes or None;
    the batch's `key_scales` / `value_scales` (both or neither) are read whole, like the cache rows.
    """
    st = batch.static
    num_tiles, num_kv_heads = q_tiles.shape[:2]
    group = batch.num_heads // num_kv_heads
    args = [meta, batch.page_tables, q_tiles, batch.key_rows, batch.value_rows]
    in_specs = [
        pl.BlockSpec(meta.shape, lambda r, h, s: (0, 0)),
        pl.BlockSpec(batch.page_tables.shape, lambda r, h, s: (0, 0)),
        pl.BlockSpec((None, None, t.rows, t.width), lambda r, h, s: (r, h, 0, 0)),
        pl.BlockSpec(batch.key_rows.shape, lambda r, h, s: (0, 0)),
        pl.BlockSpec(batch.value_rows.shape, lambda r, h, s: (0, 0)),
    ]
    if alibi_rows is not None:
        args.append(alibi_rows)
        in_specs.append(pl.BlockSpec((None, t.rows), lambda r, h, s: (h, 0)))
    if batch.qq_bias is not None:
        args.append(batch.qq_bias)
        in_specs.append(pl.BlockSpec(batch.qq_bias.shape, lambda r, h, s: (0, 0)))
    scaled = batch.key_scales is not None
    if scaled:
        args += [batch.key_scales, batch.value_scales]
        in_specs += [pl.BlockSpec(x.shape, lambda r, h, s: (0,)) for x in (batch.key_scales, batch.value_scales)]
    grid = (num_tiles, num_kv_heads, t.num_splits)
    stats = (t.num_splits, num_tiles, num_kv_heads, t.rows)
    kernel = functools.partial(
        _kernel, st=st, t=t, group=group, alibi=alibi_rows is not None, qq=batch.qq_bias is not None, scaled=scaled
    )
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((None, None, None, t.rows, t.width), lambda r, h, s: (s, r, h, 0, 0)),
            pl.BlockSpec((None, None, None, t.rows), lambda r, h, s: (s, r, h, 0)),
            pl.BlockSpec((None, None, None, t.rows), lambda r, h, s: (s, r, h, 0)),
        ],
        out_shape=[
            out_struct((*stats, t.width), jnp.float32, *args),
            out_struct(stats, jnp.float32, *args),
            out_struct(stats, jnp.float32, *args),
        ],
        compiler_params=plgpu.CompilerParams(num_warps=t.num_warps, num_stages=t.num_stages),
        interpret=t.interpret,
        name="ejkernel_paged_attention",
    )(*args)
