"""The weight-only quantized matmul kernel: packed weights streamed once, decoded in registers, dots per step.

Grid `(column blocks, contraction splits, row blocks)`. A program owns `block_m` rows of x and `block_n`
output columns, and walks its split of the contraction in steps of `block_k`. Each step loads one tile of
packed codes whole along the packed axis (the fast axis of `w`: N without transpose, K with it), so the loads
of a row are contiguous; decodes them with the group's metadata broadcast over the group, rounds the tile to
x's dtype and multiplies it with x's tile on the tensor cores, accumulating in float32. Each split writes its
own float32 partial sums; the caller adds them up.

How codes leave the words, without interleaving codes inside a step (measured on an H200 at M 16, K = N = 8192,
row layout: splitting 8-bit words by shifts and a reshape took 0.068-0.074 ms a layer, bytes 0.056):
- 8-bit codes are read as bytes (`_decode.byte_codes`: uint8, or float8 for E4M3);
- 4-bit affine and E2M1 codes with `transpose` (K packed) are read as bytes, and each tile is decoded as its two
  nibble phases, K's even and odd columns (`nibble_phases`);
- other layouts split words by shifts (`_decode.decode_tile`).
Decoding is `_triton._decode.decode_tile` (shared with the grouped matmul): affine one fused multiply-add a
value, NF4 a lookup in a 16-entry table (read through the L1 cache), E2M1 and E4M3 by assembling the float32's
bits (8-bit E4M3 by the hardware's conversion).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._triton._decode import WeightTile, as_bytes, byte_codes, decode_tile, masked_load
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


def nibble_phases(params: QuantParams, transpose: bool, k: int) -> int:
    """2 where 4-bit codes are decoded as two nibble phases, else 1: with `transpose` (K packed, even), affine and
    E2M1 codes. Measured on an H200 at M 16, K = N = 8192: int4 0.079 -> 0.039 ms, mxfp4 0.086 -> 0.064; without
    transpose (two accumulators of every other output column) int4 0.058 -> 0.087 and NF4 both ways slower."""
    return 2 if params.bits == 4 and transpose and k % 2 == 0 and params.codebook in ("int", "e2m1") else 1


def _matmul_kernel(
    *refs, params: QuantParams, transpose: bool, tiling: TritonQuantizedMatmulTiling, k: int, n: int, phases: int
):
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
    phase_params = params._replace(group_size=params.group_size // phases)

    def load_x(k0, width: int, count: int, offset: int = 0):
        k_ok = (k0 + jnp.arange(width) < count)[None, :] if count % width else None
        return masked_load(x_ref, (rows_x, pl.ds(offset + k0, width)), k_ok)

    def step(i, acc):
        if not transpose:
            w = decode_tile(w_ref, s_ref, z_ref, table_ref, WeightTile(i, bk, k, col_block, bn, n), params)
            x = load_x(pl.multiple_of(i * bk, bk), bk, k)
            return acc + dot(x, w.astype(x.dtype))
        # packed rows are output columns, packed columns the contraction; phase p multiplies x's half p
        kh, bkh = k // phases, bk // phases
        k0 = pl.multiple_of(i * bkh, bkh)
        for p, nibble in enumerate([None] if phases == 1 else [0, 1]):
            tile = WeightTile(col_block, bn, n, i, bkh, kh)
            w = decode_tile(w_ref, s_ref, z_ref, table_ref, tile, phase_params, nibble=nibble)
            x = load_x(k0, bkh, kh, p * kh)
            acc = acc + dot(x, w.astype(x.dtype), trans_b=True)
        return acc

    acc = lax.fori_loop(first, last, step, jnp.zeros((bm, bn), jnp.float32))
    n0 = pl.multiple_of(col_block * bn, bn)
    n_ok = (n0 + jnp.arange(bn) < n)[None, :] if n % bn else None
    plgpu.store(o_ref.at[split, rows_x, pl.ds(n0, bn)], acc, mask=n_ok)


def matmul(x, w, scales, zeros, *, params: QuantParams, transpose: bool, tiling: TritonQuantizedMatmulTiling):
    """float32 `[M, N]` = `x [M, K]` times the packed weights (`zeros`: None outside affine).

    Where `nibble_phases` says 2, the 4-bit codes are read as bytes and each tile decoded as its two nibble phases
    (K's even and odd columns, `decode_tile(nibble=...)`), which multiply x's even and odd columns: no step
    interleaves codes."""
    m, k = x.shape
    n = w.shape[0] if transpose else scales.shape[1] * params.group_size
    phases = nibble_phases(params, transpose, k)
    if phases == 2:  # x's even and odd columns split apart once, for the two phases
        w, x = as_bytes(w), jnp.concatenate([x[:, 0::2], x[:, 1::2]], axis=1)
    else:
        w = byte_codes(w, params)
    row_blocks = pl.cdiv(m, tiling.block_m)
    rows = row_blocks * tiling.block_m
    if rows != m:
        x = jnp.pad(x, ((0, rows - m), (0, 0)))
    table = jnp.asarray(NF4) if params.mode == "nf4" else None  # read by the kernel's lookups
    operands = [x, w, scales] + [a for a in (zeros, table) if a is not None]
    kernel = functools.partial(
        _matmul_kernel, params=params, transpose=transpose, tiling=tiling, k=k, n=n, phases=phases
    )
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
