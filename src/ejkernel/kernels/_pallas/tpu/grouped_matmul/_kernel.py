"""Grouped matmul kernels (Pallas Mosaic TPU): the forward product over the tile schedule, and the transposed one.

The schedule (`_common.grouped_matmul.work_items`) is scalar-prefetched into SMEM and drives the
index maps. `gmm` runs the grid `(column tiles, items, K steps)`: each item accumulates its lhs tile
times its group's weights in a float32 VMEM scratch and, at the last K step, writes the rows it
writes (its own, or zeros) into the output block with a select. Items of one tile are consecutive, so
the output block stays in VMEM across them and is flushed once, whole, when the tile changes.

`tgmm` runs `(Kx tiles, Ny tiles, items)`: every item adds `x_tileᵀ · y_tile` over its own rows to
the scratch of its group, whose output block stays in VMEM while the group's items run. Fill and
padding items lean on the neighbouring group's block and add nothing; the output starts as zeros
(aliased), so a group without rows (never visited) stays zero.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ejkernel.kernels._common.grouped_matmul import work_items
from ejkernel.kernels._common.vma import out_struct

NN, NT, TN = (((1,), (0,)), ((), ())), (((1,), (1,)), ((), ())), (((0,), (0,)), ((), ()))


@dataclasses.dataclass(frozen=True)
class TpuGroupedMatmulTiling:
    """One product's tiles (output rows, contraction step, output columns) and the interpret setting."""

    block_m: int
    block_k: int
    block_n: int
    interpret: object  # False, or the `pltpu.InterpretParams` to run with


def _dot(a, b, dims):
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _zero_past(x, axis: int, start, limit: int):
    """`x` with the entries at positions `start + i >= limit` along `axis` set to 0 (a partial edge block)."""
    pos = start + lax.broadcasted_iota(jnp.int32, x.shape, axis)
    return jnp.where(pos < limit, x, jnp.zeros_like(x))


def _gmm_kernel(
    tile_ref,
    group_ref,
    row_lo_ref,
    row_hi_ref,
    write_lo_ref,
    write_hi_ref,
    lhs_ref,
    rhs_ref,
    out_ref,
    acc_ref,
    *,
    t,
    k,
    transpose_rhs,
):
    item, k_step = pl.program_id(1), pl.program_id(2)
    bm, bk = t.block_m, t.block_k

    @pl.when(k_step == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(group_ref[item] >= 0)
    def _():
        a, b = lhs_ref[...], rhs_ref[...]
        if k % bk:  # the last K block runs past K: its padding may hold anything
            a = _zero_past(a, 1, k_step * bk, k)
            b = _zero_past(b, 1 if transpose_rhs else 0, k_step * bk, k)
        acc_ref[...] += _dot(a, b, NT if transpose_rhs else NN)

    @pl.when(k_step == pl.num_programs(2) - 1)
    def _():
        rows = tile_ref[item] * bm + lax.broadcasted_iota(jnp.int32, acc_ref.shape, 0)
        keep = (rows >= row_lo_ref[item]) & (rows < row_hi_ref[item])
        write = (rows >= write_lo_ref[item]) & (rows < write_hi_ref[item])
        value = jnp.where(keep, acc_ref[...], 0.0).astype(out_ref.dtype)
        out_ref[...] = jnp.where(write, value, out_ref[...])


def gmm(lhs, rhs, group_sizes, group_offset, *, transpose_rhs: bool, out_dtype, tiling: TpuGroupedMatmulTiling):
    """`out [M, N]`: each owned row of lhs times its group's rhs, zeros on every other row."""
    m, k = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    bm, bk, bn = tiling.block_m, tiling.block_k, tiling.block_n
    items = work_items(group_sizes, group_offset, rhs.shape[0], m, bm)

    def weights(j, w, kk, tile, group, *_):
        g = jnp.maximum(group[w], 0)
        return (g, j, kk) if transpose_rhs else (g, kk, j)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=6,
        grid=(pl.cdiv(n, bn), items.tile.shape[0], pl.cdiv(k, bk)),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda j, w, kk, tile, *_: (tile[w], kk)),
            pl.BlockSpec((None, bn, bk) if transpose_rhs else (None, bk, bn), weights),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda j, w, kk, tile, *_: (tile[w], j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )
    return pl.pallas_call(
        functools.partial(_gmm_kernel, t=tiling, k=k, transpose_rhs=transpose_rhs),
        grid_spec=grid_spec,
        out_shape=out_struct((m, n), out_dtype, lhs, rhs),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary")),
        interpret=tiling.interpret,
        name="ejkernel_grouped_matmul",
    )(*items, lhs, rhs)


def _block_groups(group):
    """The group whose output block each item uses: its own, else its nearest group's (0 if none)."""
    real = group >= 0
    last = lax.cummax(jnp.where(real, group, -1))
    first = jnp.where(jnp.any(real), group[jnp.argmax(real)], 0)
    return jnp.where(last >= 0, last, first).astype(jnp.int32)


def _tgmm_kernel(
    tile_ref, group_ref, block_ref, row_lo_ref, row_hi_ref, x_ref, y_ref, zeros_ref, out_ref, acc_ref, *, t
):
    del zeros_ref  # aliased to out: blocks of groups without rows stay zero
    item = pl.program_id(2)
    first_of_block = (item == 0) | (block_ref[item] != block_ref[jnp.maximum(item - 1, 0)])

    @pl.when(first_of_block)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(group_ref[item] >= 0)
    def _():
        rows = tile_ref[item] * t.block_k + lax.broadcasted_iota(jnp.int32, (x_ref.shape[0], 1), 0)
        keep = (rows >= row_lo_ref[item]) & (rows < row_hi_ref[item])
        x = jnp.where(keep, x_ref[...], jnp.zeros_like(x_ref))
        y = jnp.where(keep, y_ref[...], jnp.zeros_like(y_ref))  # the edge tile's padding rows may hold anything
        acc_ref[...] += _dot(x, y, TN)

    out_ref[...] = acc_ref[...].astype(out_ref.dtype)


def tgmm(x, y, group_sizes, group_offset, *, num_local: int, out_dtype, tiling: TpuGroupedMatmulTiling):
    """`[L, Kx, Ny]`: per local group l, `x_lᵀ · y_l` over its rows; zeros for an empty group."""
    m, kx = x.shape
    ny = y.shape[1]
    bm, bk, bn = tiling.block_m, tiling.block_k, tiling.block_n  # bk: rows of x and y per item
    items = work_items(group_sizes, group_offset, num_local, m, bk)
    prefetch = (items.tile, items.group, _block_groups(items.group), items.row_lo, items.row_hi)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(prefetch),
        grid=(pl.cdiv(kx, bm), pl.cdiv(ny, bn), items.tile.shape[0]),
        in_specs=[
            pl.BlockSpec((bk, bm), lambda a, b, w, tile, *_: (tile[w], a)),
            pl.BlockSpec((bk, bn), lambda a, b, w, tile, *_: (tile[w], b)),
            pl.BlockSpec(memory_space=pl.ANY),
        ],
        out_specs=pl.BlockSpec((None, bm, bn), lambda a, b, w, tile, group, block, *_: (block[w], a, b)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )
    # Whole output blocks (padded), so the aliased zeros cover every block the kernel writes.
    shape = (num_local, pl.cdiv(kx, bm) * bm, pl.cdiv(ny, bn) * bn)
    out = pl.pallas_call(
        functools.partial(_tgmm_kernel, t=tiling),
        grid_spec=grid_spec,
        out_shape=out_struct(shape, out_dtype, x, y),
        input_output_aliases={len(prefetch) + 2: 0},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=tiling.interpret,
        name="ejkernel_grouped_matmul_transposed",
    )(*prefetch, x, y, jnp.zeros(shape, out_dtype))
    return out[:, :kx, :ny]
