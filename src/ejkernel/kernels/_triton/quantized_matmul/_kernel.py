"""The weight-only quantized matmul kernel: packed weights streamed once, decoded in registers, one dot per step.

Grid `(column blocks, contraction splits, row blocks)`. A program owns `block_m` rows of x and `block_n`
output columns, and walks its split of the contraction in steps of `block_k`. Each step loads one tile of
packed words whole along the packed axis (the fast axis of `w`: N without transpose, K with it), so the
loads of a row are contiguous; splits each word into its `32 / bits` codes (a shift per code position, then
a reshape that lays the codes out in column order), turns them into values and multiplies them with x's tile
on the tensor cores, accumulating in float32. Each split writes its own float32 partial sums; the caller adds
them up.

Four tiling switches cut the work per weight (each off is the plain decode, kept for A/B sweeps):

- `fold_scales`: where a step's tile lies inside one group (`block_n` divides g without transpose, `block_k`
  divides g with it) the group's scale is not applied per weight. Without transpose the scale varies along
  the contraction, so it multiplies x's `[block_m, block_k]` tile (rounded to x's dtype, as the plain path
  rounds each weight); with transpose it varies along the output columns and multiplies the step's float32
  product. The weight tile is then only codes turned into values (exact in x's dtype: affine codes have at
  most 8 bits, E2M1 / E4M3 values 2 or 3 mantissa bits; NF4 entries round as the plain path's weights do),
  and affine's zero point is one small product a step: `-Σ_k (x·s)[m, k] z[k]` without transpose, `-z[n]·Σ_k
  x[m, k]` with it.
- `magic_codes` (affine): codes to floats without an int -> float conversion (`_decode.integer_codes`: the
  code OR'ed into the mantissa of a power of two P). Folded, and where the codes fit x's 16-bit mantissa
  (4-bit codes in bf16, any in f16), the tile keeps the offset P (one OR a weight, no arithmetic) and the
  zero term subtracts it.
- `paired_codes` (folded affine codes that keep the offset): two codes a 32-bit operation, `(word >> j·b) &
  0x000F000F | P·0x10001` spelling a code in each 16-bit half (`_decode.spelled_code_pairs`), the halves
  joined into column order.
- `swap_ab`: the dot computes `outᵀ [block_n, block_m] = W_tileᵀ · xᵀ`, the decoded weights being its first
  operand (the one an MMA may take from registers) and the small x tile the second; the accumulator is
  transposed once when stored.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._triton._decode import (
    WeightTile,
    code_values,
    decode_tile,
    group_metadata,
    integer_codes,
    load_codes,
    load_words,
    magic_offset,
    masked_load,
    scale_factors,
    spelled_code_pairs,
)
from ejkernel.kernels._triton._helpers import dot
from ejkernel.quantization.codes import NF4
from ejkernel.quantization.modes import QuantParams


@dataclasses.dataclass(frozen=True)
class TritonQuantizedMatmulTiling:
    """Tiles and launch settings: x rows, output columns, contraction per step, contraction splits; and the
    decode variants (module docstring): scales folded out of the weights, affine codes spelled into floats (two
    a 32-bit operation with `paired_codes`), the dot's operands swapped. All off is the plain decode."""

    block_m: int
    block_n: int
    block_k: int
    splits: int
    num_warps: int
    num_stages: int
    interpret: bool
    fold_scales: bool = False
    magic_codes: bool = False
    swap_ab: bool = False
    paired_codes: bool = False


def check_variants(tiling: TritonQuantizedMatmulTiling, params: QuantParams, transpose: bool, dtype) -> None:
    """ValueError where the tiling asks for a variant the call (x's `dtype`) cannot have."""
    if tiling.magic_codes and params.mode != "affine":
        raise ValueError(f"magic_codes needs affine integer codes, got mode {params.mode!r}")
    if tiling.paired_codes and not (tiling.fold_scales and tiling.magic_codes and magic_offset(dtype, params.bits)):
        raise ValueError(
            "paired_codes needs fold_scales, magic_codes and codes that fit x's 16-bit mantissa (4-bit in bf16, "
            f"4/8-bit in f16), got fold_scales={tiling.fold_scales}, magic_codes={tiling.magic_codes}, "
            f"{params.bits}-bit codes, x {jnp.dtype(dtype).name}"
        )
    block, name = (tiling.block_k, "block_k") if transpose else (tiling.block_n, "block_n")
    if tiling.fold_scales and params.group_size % block:
        raise ValueError(
            f"fold_scales needs {name} dividing the group size {params.group_size} (a step inside one group), "
            f"got {name}={block}"
        )


def _step_product(x, w, *, transpose: bool, swap_ab: bool):
    """float32 `x [bm, bk]` times the weight tile (`[bn, bk]` with transpose, else `[bk, bn]`): `[bm, bn]`, or
    its transpose `[bn, bm]` with `swap_ab` (the weights the first operand)."""
    if swap_ab:
        return dot(w, x, trans_a=not transpose, trans_b=True)
    return dot(x, w, trans_b=transpose)


def _matmul_kernel(*refs, params: QuantParams, transpose: bool, tiling: TritonQuantizedMatmulTiling, k: int, n: int):
    x_ref, w_ref, s_ref = refs[:3]
    z_ref = refs[3] if params.mode == "affine" else None
    table_ref = refs[3] if params.mode == "nf4" else None
    o_ref = refs[-1]
    bm, bn, bk, g = tiling.block_m, tiling.block_n, tiling.block_k, params.group_size
    op = x_ref.dtype  # the dot operands' dtype
    swap = tiling.swap_ab
    col_block, split, row_block = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    steps = pl.cdiv(k, bk)
    per_split = pl.cdiv(steps, tiling.splits)
    first = split * per_split
    last = jnp.minimum(first + per_split, steps)
    rows_x = pl.ds(pl.multiple_of(row_block * bm, bm), bm)
    product = functools.partial(_step_product, transpose=transpose, swap_ab=swap)
    per_column = (lambda v: v[:, None]) if swap else (lambda v: v[None, :])  # [bn] over the accumulator
    per_row = (lambda v: v[None, :]) if swap else (lambda v: v[:, None])  # [bm] over the accumulator
    offset = magic_offset(op, params.bits) if tiling.magic_codes else 0

    def weight_values(tile):
        """The folded path's weight tile in x's dtype: codes as values, `offset` added to affine codes."""
        if tiling.paired_codes:
            return spelled_code_pairs(load_words(w_ref, tile, params.bits), params.bits, op)
        codes = load_codes(w_ref, tile, params.bits)
        if params.mode != "affine":
            return code_values(codes, params, table_ref).astype(op)
        return integer_codes(codes, op, params.bits, True) if tiling.magic_codes else codes.astype(op)

    def plain_step(x, i):
        tile = WeightTile(col_block, bn, n, i, bk, k) if transpose else WeightTile(i, bk, k, col_block, bn, n)
        w = decode_tile(w_ref, s_ref, z_ref, table_ref, tile, params, magic=tiling.magic_codes)
        return product(x, w.astype(op))

    def folded_step(x, i):
        if transpose:  # one group along this step's K: scales per output column, applied to the product
            tile = WeightTile(col_block, bn, n, i, bk, k)
            out = product(x, weight_values(tile))
            if params.mode == "affine":
                zeros = group_metadata(z_ref, tile, g).astype(jnp.float32) + offset
                out = out - per_row(x.astype(jnp.float32).sum(axis=1)) * per_column(zeros)
            return out * per_column(scale_factors(group_metadata(s_ref, tile, g), params))
        tile = WeightTile(i, bk, k, col_block, bn, n)  # one group along N: scales per K, applied to x
        xs = (x.astype(jnp.float32) * scale_factors(group_metadata(s_ref, tile, g), params)[None, :]).astype(op)
        out = product(xs, weight_values(tile))
        if params.mode == "affine":
            zeros = group_metadata(z_ref, tile, g).astype(jnp.float32) + offset
            out = out - per_row((xs.astype(jnp.float32) * zeros[None, :]).sum(axis=1))
        return out

    def step(i, acc):
        k0 = pl.multiple_of(i * bk, bk)
        k_ok = (k0 + jnp.arange(bk) < k)[None, :] if k % bk else None
        x = masked_load(x_ref, (rows_x, pl.ds(k0, bk)), k_ok)
        return acc + (folded_step if tiling.fold_scales else plain_step)(x, i)

    acc = lax.fori_loop(first, last, step, jnp.zeros((bn, bm) if swap else (bm, bn), jnp.float32))
    n0 = pl.multiple_of(col_block * bn, bn)
    n_ok = (n0 + jnp.arange(bn) < n)[None, :] if n % bn else None
    plgpu.store(o_ref.at[split, rows_x, pl.ds(n0, bn)], acc.T if swap else acc, mask=n_ok)


def matmul(x, w, scales, zeros, *, params: QuantParams, transpose: bool, tiling: TritonQuantizedMatmulTiling):
    """float32 `[M, N]` = `x [M, K]` times the packed weights (`zeros`: None outside affine); ValueError for
    a variant the call cannot have (`check_variants`)."""
    check_variants(tiling, params, transpose, x.dtype)
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
