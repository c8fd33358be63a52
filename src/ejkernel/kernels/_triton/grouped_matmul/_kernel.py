"""Grouped matmul kernels (Pallas-Triton): the forward product over the tile schedule, and the transposed product.

`gmm`: one program per (span, column tile). A span of the schedule (`_common.grouped_matmul.row_spans`)
names `block_m` rows of lhs from any row on and the group they belong to; the program streams those rows
and the group's weights along K in `block_k` steps into a float32 `[block_m, block_n]` accumulator, then
stores the rows it is told to write (zeros for a span of unowned rows). Spans follow each group from its
first row, so no group is padded to a tile and no tile is computed twice; only a group's last span is
partial. Programs of one span run next to each other (column tiles fastest), so the span's rows are
read from memory once and its group's weights stay in L2 across the group's spans.

`tgmm`: one program per (group, `block_m` x `block_n` output tile); it walks its group's rows in
`block_k`-row steps from wherever the group starts, masking the rows past its end, and accumulates
`x_stepᵀ · y_step`. An empty group writes zeros.

Both take whole arrays (no BlockSpecs) and load with masks only where a size is not a tile multiple.

`gmm` also takes quantized weights (`_common.grouped_matmul_quantized`), decoded tile by tile in registers and
rounded to lhs's dtype before each dot: packed codes by `_triton._decode.decode_tile`; v3 weights (int8, FP8)
converted and multiplied by their block scales (one per output column, where a K step lies in one scale
block), or, where K is the output (the lhs gradient), lhs's tile multiplied along the contraction instead.
Steps and output tiles along K are cut to divide the scale blocks, so each takes one row of scales. With
`fp8_lhs` (FP8 weights, one step a scale block) lhs is rounded to FP8 per row and block once, before the kernel
(`fp8_row_blocks`; rounded inside, each of the N tiles repeated it: 7.3 ms against bf16's 0.74 on an H200), and
the kernel multiplies FP8 by FP8: `acc += (a8 · w8) · (sa · s)`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.grouped_matmul import local_group_bounds, row_spans
from ejkernel.kernels._common.grouped_matmul_quantized import PackedGroupWeights, ScaledGroupWeights, fp8_row_blocks
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._triton._decode import WeightTile, byte_codes, decode_tile
from ejkernel.kernels._triton._helpers import dot
from ejkernel.quantization.codes import NF4

MAX_DECODED = 1 << 15  # decoded values of one step's packed tile (held in registers: 128 a thread at 8 warps)


@dataclasses.dataclass(frozen=True)
class TritonGroupedMatmulTiling:
    """One product's tiles: output rows, contraction step, output columns; Triton's warps and stages; whether
    the forward of v3 FP8 weights rounds lhs to FP8 and multiplies on FP8 tensor cores (`fp8_lhs`)."""

    block_m: int
    block_k: int
    block_n: int
    num_warps: int
    num_stages: int
    interpret: bool
    fp8_lhs: bool = False


def _tile_mask(row_mask, col_mask):
    """The 2-D mask of a tile from its row and column masks (None: nothing masked)."""
    if row_mask is None:
        return None if col_mask is None else col_mask[None, :]
    return row_mask[:, None] if col_mask is None else row_mask[:, None] & col_mask[None, :]


def _load(ref, index, row_mask, col_mask):
    """The 2-D tile `ref[index]` (index ends in two `pl.ds`), zeros where a given mask is False."""
    mask = _tile_mask(row_mask, col_mask)
    if mask is None:
        return ref[index]
    return plgpu.load(ref.at[index], mask=mask, other=0)


def _gmm_kernel(
    start_ref,
    group_ref,
    write_lo_ref,
    write_hi_ref,
    lhs_ref,
    *refs,
    t: TritonGroupedMatmulTiling,
    m: int,
    k: int,
    n: int,
    transpose_rhs: bool,
    weights,
):
    """`weights`: None (a float rhs), `PackedGroupWeights` or `ScaledGroupWeights` with their arrays' refs
    in its place (the NF4 table after packed nf4 codes; with `fp8_lhs`, lhs's scales after the weights'); `refs`
    are those refs, then the output's."""
    *weight_refs, out_ref = refs
    bm, bk, bn = t.block_m, t.block_k, t.block_n
    col_tiles = pl.cdiv(n, bn)
    pid = pl.program_id(0)
    span, col_tile = lax.div(pid, jnp.int32(col_tiles)), lax.rem(pid, jnp.int32(col_tiles))
    row0, group = start_ref[span], group_ref[span]
    col0 = pl.multiple_of(col_tile * bn, bn)
    row_ids = row0 + jnp.arange(bm, dtype=jnp.int32)
    col_ids = col0 + jnp.arange(bn, dtype=jnp.int32)
    rows, cols = pl.ds(row0, bm), pl.ds(col0, bn)
    row_mask = row_ids < m if m < bm else None  # (spans end by M when it holds a whole one)
    col_mask = col_ids < n if n % bn else None
    group_index = jnp.maximum(group, 0)  # fill and padding spans run no step

    def weight_tile(i, ks, k_mask):
        """The step's weights as stored (`[bn, bk]` with transpose_rhs, else `[bk, bn]`), in their dtype or,
        packed, as float32."""
        if isinstance(weights, PackedGroupWeights):
            w_ref, s_ref, *extra = weight_refs
            z_ref = extra[0] if weights.params.mode == "affine" else None
            table_ref = extra[0] if weights.params.mode == "nf4" else None
            tile = WeightTile(col_tile, bn, n, i, bk, k) if transpose_rhs else WeightTile(i, bk, k, col_tile, bn, n)
            return decode_tile(w_ref, s_ref, z_ref, table_ref, tile, weights.params, prefix=(group_index,))
        if transpose_rhs:
            return _load(weight_refs[0], (group_index, cols, ks), col_mask, k_mask)
        return _load(weight_refs[0], (group_index, ks, cols), k_mask, col_mask)

    def step(i, acc):
        k0 = pl.multiple_of(i * bk, bk)
        ks = pl.ds(k0, bk)
        k_mask = k0 + jnp.arange(bk, dtype=jnp.int32) < k if k % bk else None
        a = _load(lhs_ref, (rows, ks), row_mask, k_mask)
        w = weight_tile(i, ks, k_mask)
        if isinstance(weights, ScaledGroupWeights):
            scale_ref, block = weight_refs[1], weights.block
            if transpose_rhs != weights.k_first:  # the contraction is K: the step lies in one scale block
                s = _load(scale_ref, (group_index, pl.ds(lax.div(k0, block), 1), 0, cols), None, col_mask)
                s = s.astype(jnp.float32)  # [1, bn]: one scale per output column
                if t.fp8_lhs:  # the step is one scale block: lhs comes as FP8 codes with a scale per row and block
                    sa = _load(weight_refs[2], (rows, pl.ds(i, 1)), row_mask, None)
                    return acc + dot(a, w, trans_b=transpose_rhs) * (sa * s)
                w = w.astype(jnp.float32) * (s.reshape(bn, 1) if transpose_rhs else s)
            else:  # K is the output (the lhs gradient): the output tile lies in one block, scales run along N
                s = _load(scale_ref, (group_index, pl.ds(lax.div(col0, block), 1), 0, ks), None, k_mask)
                a = (a.astype(jnp.float32) * s.astype(jnp.float32)).astype(a.dtype)
        return acc + dot(a, w.astype(a.dtype), trans_b=transpose_rhs)

    steps = jnp.where(group >= 0, jnp.int32(pl.cdiv(k, bk)), jnp.int32(0))  # loop bounds of one type
    acc = lax.fori_loop(0, steps, step, jnp.zeros((bm, bn), jnp.float32))
    write = (row_ids >= write_lo_ref[span]) & (row_ids < write_hi_ref[span])
    plgpu.store(out_ref.at[rows, cols], acc.astype(out_ref.dtype), mask=_tile_mask(write, col_mask))


def _largest_power_of_two_dividing(size: int) -> int:
    return size & -size


def fit_to_weights(tiling: TritonGroupedMatmulTiling, weights, transpose_rhs: bool) -> TritonGroupedMatmulTiling:
    """`tiling` with its tiles along K cut to divide v3 scale blocks (`weights.block`, a multiple of 16), and
    packed steps cut to decode at most `MAX_DECODED` values."""
    if isinstance(weights, ScaledGroupWeights):
        largest = _largest_power_of_two_dividing(weights.block)
        if transpose_rhs != weights.k_first:
            return dataclasses.replace(tiling, block_k=min(tiling.block_k, largest))
        return dataclasses.replace(tiling, block_n=min(tiling.block_n, largest))
    if isinstance(weights, PackedGroupWeights):
        return dataclasses.replace(tiling, block_k=max(16, min(tiling.block_k, MAX_DECODED // tiling.block_n)))
    return tiling


def _weight_operands(rhs) -> list:
    """The arrays the kernel reads for `rhs`, in its `refs` order."""
    if isinstance(rhs, PackedGroupWeights):
        extra = {"affine": [rhs.zeros], "nf4": [jnp.asarray(NF4)]}.get(rhs.params.mode, [])
        return [byte_codes(rhs.data, rhs.params), rhs.scales, *extra]
    if isinstance(rhs, ScaledGroupWeights):
        return [rhs.data, rhs.scale]
    return [rhs]


def gmm(lhs, rhs, group_sizes, group_offset, *, transpose_rhs: bool, out_dtype, tiling: TritonGroupedMatmulTiling):
    """`out [M, N]`: each owned row of lhs times its group's rhs, zeros on every other row. `rhs` is a float
    `[L, K, N]` (`[L, N, K]` with `transpose_rhs`) or quantized weights standing for one."""
    m, k = lhs.shape
    num_local = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    tiling = fit_to_weights(tiling, rhs, transpose_rhs)
    spans = row_spans(group_sizes, group_offset, num_local, m, tiling.block_m)
    quantized = isinstance(rhs, PackedGroupWeights | ScaledGroupWeights)
    weights = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), rhs) if quantized else None
    operands = _weight_operands(rhs)
    if tiling.fp8_lhs:
        lhs, lhs_scales = fp8_row_blocks(lhs, tiling.block_k)
        operands.append(lhs_scales)
    kernel = functools.partial(_gmm_kernel, t=tiling, m=m, k=k, n=n, transpose_rhs=transpose_rhs, weights=weights)
    # The output dtype straight from the kernel: on an H100 at M=32768 K=4096 N=1536 G=64 bf16 that took
    # 0.88 ms against 1.01 for float32 and a cast. (The earlier kernel over straddled tiles, which zeroed
    # unowned rows with a `where` before its store, ran slower storing bf16: 1.09 against 0.95 ms.)
    return pl.pallas_call(
        kernel,
        grid=(spans.start.shape[0] * pl.cdiv(n, tiling.block_n),),
        out_shape=out_struct((m, n), out_dtype, lhs, operands[0]),
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=tiling.num_stages),
        interpret=tiling.interpret,
        name="ejkernel_grouped_matmul",
    )(*spans, lhs, *operands)


def _tgmm_kernel(starts_ref, ends_ref, x_ref, y_ref, out_ref, *, t: TritonGroupedMatmulTiling, kx: int, ny: int):
    bk, bm, bn = t.block_k, t.block_m, t.block_n  # bk: rows per step; the output tile is bm x bn
    group, a_tile, b_tile = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    start, end = starts_ref[group], ends_ref[group]
    a0, b0 = pl.multiple_of(a_tile * bm, bm), pl.multiple_of(b_tile * bn, bn)
    a_cols, b_cols = pl.ds(a0, bm), pl.ds(b0, bn)
    a_mask = a0 + jnp.arange(bm, dtype=jnp.int32) < kx if kx % bm else None
    b_mask = b0 + jnp.arange(bn, dtype=jnp.int32) < ny if ny % bn else None

    def step(i, acc):
        r0 = start + i * bk
        row_mask = r0 + jnp.arange(bk, dtype=jnp.int32) < end
        x = _load(x_ref, (pl.ds(r0, bk), a_cols), row_mask, a_mask)
        y = _load(y_ref, (pl.ds(r0, bk), b_cols), row_mask, b_mask)
        return acc + dot(x, y, trans_a=True)

    steps = lax.div(end - start + (bk - 1), jnp.int32(bk))
    acc = lax.fori_loop(0, steps, step, jnp.zeros((bm, bn), jnp.float32))
    plgpu.store(out_ref.at[group, a_cols, b_cols], acc.astype(out_ref.dtype), mask=_tile_mask(a_mask, b_mask))


def tgmm(x, y, group_sizes, group_offset, *, num_local: int, out_dtype, tiling: TritonGroupedMatmulTiling):
    """`[L, Kx, Ny]`: per local group l, `x_lᵀ · y_l` over its rows; zeros for an empty group."""
    m, kx = x.shape
    ny = y.shape[1]
    starts, ends = local_group_bounds(group_sizes, group_offset, num_local, m)
    kernel = functools.partial(_tgmm_kernel, t=tiling, kx=kx, ny=ny)
    return pl.pallas_call(
        kernel,
        grid=(num_local, pl.cdiv(kx, tiling.block_m), pl.cdiv(ny, tiling.block_n)),
        out_shape=out_struct((num_local, kx, ny), out_dtype, x, y),
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=tiling.num_stages),
        interpret=tiling.interpret,
        name="ejkernel_grouped_matmul_transposed",
    )(starts, ends, x, y)
