"""The weight-only quantized matmul kernel: packed weights streamed once, decoded in registers, one dot per step.

Grid `(column blocks, contraction splits, row blocks)`. A program owns `block_m` rows of x and `block_n`
output columns, and walks its split of the contraction in steps of `block_k`. Each step loads one tile of
packed words whole along the packed axis (the fast axis of `w`: N without transpose, K with it), so the
loads of a row are contiguous; splits each word into its `32 / bits` codes (a shift per code position, then
a reshape that lays the codes out in column order), decodes them with the group's metadata broadcast over
the group, rounds the tile to x's dtype and multiplies it with x's tile on the tensor cores, accumulating in
float32. Each split writes its own float32 partial sums; the caller adds them up.

Decoding: affine `q·s + (−z·s)` (one fused multiply-add a value); NF4 a lookup in a 16-entry table (read
through the L1 cache); E2M1 and E4M3 codes by assembling the float32's bits; mx scales `2^e` from the
exponent byte, nv scales decoded as E4M3. All metadata arithmetic runs on the `[rows, groups]` tile before
it is broadcast.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

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


def _bits_to_float(bits):
    return lax.bitcast_convert_type(bits, jnp.float32)


def _e2m1(codes):
    """float32 value of FP4 E2M1 codes (int32): sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0."""
    exponent, mantissa = (codes >> 1) & 3, codes & 1
    normal = ((exponent + 126) << 23) | (mantissa << 22)
    subnormal = mantissa * (126 << 23)  # exponent 0: 0 or 0.5
    return _bits_to_float(jnp.where(exponent == 0, subnormal, normal) | ((codes & 8) << 28))


def _e4m3(codes):
    """float32 value of FP8 E4M3 (FN) codes (int32): sign bit 7, exponent bits 6-3 (bias 7), 0x7F NaN."""
    exponent, mantissa = (codes >> 3) & 15, codes & 7
    normal = _bits_to_float(((exponent + 120) << 23) | (mantissa << 20))
    magnitude = jnp.where(exponent == 0, mantissa.astype(jnp.float32) * 2.0**-9, normal)
    magnitude = jnp.where((codes & 0x7F) == 0x7F, jnp.nan, magnitude)
    return jnp.where((codes & 0x80) != 0, -magnitude, magnitude)


def _pow2(byte):
    """float32 `2^e` for the two's-complement exponent byte `e` (int32 0..255), from two normal halves."""
    exponent = jnp.where(byte >= 128, byte - 256, byte)
    half = exponent >> 1
    return _bits_to_float((half + 127) << 23) * _bits_to_float((exponent - half + 127) << 23)


def _load(ref, index, mask):
    if mask is None:
        return ref[index]
    return plgpu.load(ref.at[index], mask=mask, other=0)


@dataclasses.dataclass(frozen=True)
class _WeightTile:
    """Where one tile of the packed matrix lies: `rows` packed rows from block `row_block`, `cols` unpacked
    columns from block `col_block`; `row_count` and `col_count` are the matrix's (for masking a partial tile)."""

    row_block: jax.Array
    rows: int
    row_count: int
    col_block: jax.Array
    cols: int
    col_count: int


def _decode(w_ref, s_ref, z_ref, table_ref, tile: _WeightTile, params: QuantParams):
    """float32 `[rows, cols]` values of one tile of the packed matrix."""
    bits, g = params.bits, params.group_size
    per_word = 32 // bits
    words = tile.cols // per_word
    row0 = pl.multiple_of(tile.row_block * tile.rows, tile.rows)
    row_ok = None
    if tile.row_count % tile.rows:
        row_ok = (row0 + jnp.arange(tile.rows) < tile.row_count)[:, None]
    ragged_cols = tile.col_count % tile.cols != 0

    def mask(cols_ok):
        if cols_ok is None:
            return row_ok
        return cols_ok[None, :] if row_ok is None else row_ok & cols_ok[None, :]

    word0 = pl.multiple_of(tile.col_block * words, words)
    word_ok = word0 + jnp.arange(words) < tile.col_count // per_word if ragged_cols else None
    packed = _load(w_ref, (pl.ds(row0, tile.rows), pl.ds(word0, words)), mask(word_ok))
    shifts = jnp.arange(per_word, dtype=jnp.uint32) * bits
    codes = (packed[:, :, None] >> shifts[None, None, :]) & jnp.uint32((1 << bits) - 1)
    codes = codes.reshape(tile.rows, tile.cols).astype(jnp.int32)  # code i of a row is column i

    if tile.cols >= g:  # whole groups in the tile: metadata [rows, groups], broadcast over each group below
        groups = tile.cols // g
        group0 = pl.multiple_of(tile.col_block * groups, groups)
        group_ok = group0 + jnp.arange(groups) < tile.col_count // g if ragged_cols else None
        meta_index, meta_mask = (pl.ds(row0, tile.rows), pl.ds(group0, groups)), mask(group_ok)
    else:  # the tile lies inside one group: metadata [rows, 1]
        groups = 1
        group = lax.div(tile.col_block * tile.cols, jnp.int32(g))
        meta_index, meta_mask = (pl.ds(row0, tile.rows), pl.ds(group, 1)), row_ok

    def spread(meta):
        """`[rows, groups]` metadata to `[rows, cols]`, each group's value over its columns."""
        if groups == 1:
            return meta
        return jnp.broadcast_to(meta[:, :, None], (tile.rows, groups, g)).reshape(tile.rows, tile.cols)

    scales = _load(s_ref, meta_index, meta_mask)
    if params.mode == "affine":
        scales = scales.astype(jnp.float32)
        offsets = -_load(z_ref, meta_index, meta_mask).astype(jnp.float32) * scales
        return codes.astype(jnp.float32) * spread(scales) + spread(offsets)
    if params.mode == "nf4":
        return table_ref[codes] * spread(scales.astype(jnp.float32))
    values = _e2m1(codes) if bits == 4 else _e4m3(codes)
    scales = scales.astype(jnp.int32)
    factors = _pow2(scales) if params.mode.startswith("mx") else _e4m3(scales)
    return values * spread(factors)


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
        x = _load(x_ref, (rows_x, pl.ds(k0, bk)), k_ok)
        if transpose:  # packed rows are output columns, packed columns the contraction
            w = _decode(w_ref, s_ref, z_ref, table_ref, _WeightTile(col_block, bn, n, i, bk, k), params)
            return acc + dot(x, w.astype(x.dtype), trans_b=True)
        w = _decode(w_ref, s_ref, z_ref, table_ref, _WeightTile(i, bk, k, col_block, bn, n), params)
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
    operands = [x, w, scales] + [a for a in (zeros, table) if a is not None]
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
