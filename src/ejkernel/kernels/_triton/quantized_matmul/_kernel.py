"""The weight-only quantized matmul kernel: packed weights streamed once, decoded in registers, one dot per step.

Grid `(column blocks, contraction splits, row blocks)`. A program owns `block_m` rows of x and `block_n`
output columns, and walks its split of the contraction in steps of `block_k`. Each step loads one tile of
packed words whole along the packed axis (the fast axis of `w`: N without transpose, K with it), so the
loads of a row are contiguous; splits each word into its `32 / bits` codes (a shift per code position, then
a reshape that lays the codes out in column order), decodes them with the group's metadata broadcast over
the group, rounds the tile to x's dtype and multiplies it with x's tile on the tensor cores, accumulating in
float32. Each split writes its own float32 partial sums; the caller adds them up.

Decoding is `_triton._decode.decode_tile` (shared with the grouped matmul): affine one fused multiply-add a
value, NF4 a lookup in a 16-entry table (read through the L1 cache), E2M1 and E4M3 by assembling the float32's
bits.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._triton._decode import WeightTile, byte_codes, decode_tile, masked_load
from ejkernel.kernels._triton._helpers import dot
from ejkernel.quantization.codes import NF4
from ejkernel.quantization.modes import QuantParams


@dataclasses.dataclass(frozen=True)
class TritonQuantizedMatmulTiling:
    """Tiles and launch settings: x rows, output columns, contraction per step, contraction splits."""

    block_m: int
    block_n: int
    block_k: int
    splits: int
    num_warps: int
    num_stages: int
    interpret: bool


def _matmul_kernel(*refs, params: QuantParams, transpose: bool, tiling: TritonQuantizedMatmulTiling, k: int, n: int):
    x_ref, w_ref, s_ref = refs[:3]
    z_ref = refs[3] if params.mode == "affine" else None
    table_ref = refs[3] if params.mode == "nf4" else None
    o_ref = refs[-1]
    bm, bn, bk = tiling.block_m, tiling.block_n, tiling.block_k
    col_block, split, row_block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    steps = pl.cdiv(k, bk)
    per_split = pl.cdiv(steps, tiling.splits)
    first = split * per_split
    last = jnp.minimum(first + per_split, steps)
    rows_x = pl.ds(pl.multiple_of(row_block * bm, bm), bm)

    def step(i, acc):
        k0 = pl.multiple_of(i * bk, bk)
        k_ok = (k0 + jnp.arange(bk) < k)[None, :] if k % bk else None
        x = masked_load(x_ref, (rows_x, pl.ds(k0, bk)), k_ok)
        if transpose:  # packed rows are output columns, packed columns the contraction
            w = decode_tile(w_ref, s_ref, z_ref, table_ref, WeightTile(col_block, bn, n, i, bk, k), params)
            return acc + dot(x, w.astype(x.dtype), trans_b=True)
        w = decode_tile(w_ref, s_ref, z_ref, table_ref, WeightTile(i, bk, k, col_block, bn, n), params)
        return acc + dot(x, w.astype(x.dtype))

    acc = lax.fori_loop(first, last, step, jnp.zeros((bm, bn), jnp.float32))
    n0 = pl.multiple_of(col_block * bn, bn)
    n_ok = (n0 + jnp.arange(bn) < n)[None, :] if n % bn else None
    plgpu.store(o_ref.at[split, rows_x, pl.ds(n0, bn)], acc, mask=n_ok)


def matmul(x, w, scales, zeros, *, params: QuantParams, transpose: bool, tiling: TritonQuantizedMatmulTiling):
    """float32 `[M, N]` = `x [M, K]` times the packed weights (`zeros`: None outside affine)."""
    m, k = x.shape
    n = w.shape[0] if transpose else scales.shape[1] * params.group_size
    row_blocks = pl.cdiv(m, tiling.block_m)
    rows = row_blocks * tiling.block_m
    if rows != m:
        x = jnp.pad(x, ((0, rows - m), (0, 0)))
    table = jnp.asarray(NF4) if params.mode == "nf4" else None  # read by the kernel's lookups
    operands = [x, byte_codes(w, params), scales] + [a for a in (zeros, table) if a is not None]
    kernel = functools.partial(_matmul_kernel, params=params, transpose=transpose, tiling=tiling, k=k, n=n)
    partial = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((tiling.splits, rows, n), jnp.float32),
        grid=(pl.cdiv(n, tiling.block_n), tiling.splits, row_blocks),
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=tiling.num_stages),
        interpret=tiling.interpret,
        name="ejkernel_quantized_matmul",
    )(*operands)
    out = partial[0] if tiling.splits == 1 else partial.sum(axis=0)
    return out[:m]
