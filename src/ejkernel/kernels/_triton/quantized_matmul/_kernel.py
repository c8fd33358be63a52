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
- 4-bit codes along an even packed axis are read as bytes, and each tile is decoded as its two nibble phases,
  the packed axis's even and odd columns (`matmul`);
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
    nibbles = [None] if phases == 1 else [0, 1]

    def decode(tile, nibble):
        return decode_tile(w_ref, s_ref, z_ref, table_ref, tile, phase_params, nibble=nibble)

    def load_x(k0, width: int, count: int, offset: int = 0):
        k_ok = (k0 + jnp.arange(width) < count)[None, :] if count % width else None
        return masked_load(x_ref, (rows_x, pl.ds(offset + k0, width)), k_ok)

    def step(i, accs):
        if transpose:  # packed rows are output columns, packed columns the contraction (phase p: x's half p)
            kh, bkh = k // phases, bk // phases
            k0 = pl.multiple_of(i * bkh, bkh)
            acc = accs[0]
            for p, nibble in enumerate(nibbles):
                x = load_x(k0, bkh, kh, p * kh)
                w = decode(WeightTile(col_block, bn, n, i, bkh, kh), nibble)
                acc = acc + dot(x, w.astype(x.dtype), trans_b=True)
            return (acc,)
        x = load_x(pl.multiple_of(i * bk, bk), bk, k)  # phase p: the output columns p, p + phases, ...
        tile = WeightTile(i, bk, k, col_block, bn // phases, n // phases)
        return tuple(acc + dot(x, decode(tile, b).astype(x.dtype)) for acc, b in zip(accs, nibbles, strict=True))

    width, outputs = (bn, 1) if transpose else (bn // phases, phases)
    accs = lax.fori_loop(first, last, step, tuple(jnp.zeros((bm, width), jnp.float32) for _ in range(outputs)))
    count = n if transpose else n // phases
    n0 = pl.multiple_of(col_block * width, width)
    n_ok = (n0 + jnp.arange(width) < count)[None, :] if count % width else None
    for p, acc in enumerate(accs):
        plgpu.store(o_ref.at[split, jnp.int32(p), rows_x, pl.ds(n0, width)], acc, mask=n_ok)


def matmul(x, w, scales, zeros, *, params: QuantParams, transpose: bool, tiling: TritonQuantizedMatmulTiling):
    """float32 `[M, N]` = `x [M, K]` times the packed weights (`zeros`: None outside affine).

    4-bit codes along an even packed axis are read as bytes and each tile decoded as its two nibble phases (the
    even and the odd columns of the packed axis, `decode_tile(nibble=...)`), so no step interleaves codes: without
    transpose each phase is its own accumulator of every other output column, interleaved once by XLA; with it
    the phases multiply x's even and odd columns, split apart once here."""
    m, k = x.shape
    n = w.shape[0] if transpose else scales.shape[1] * params.group_size
    packed_axis = k if transpose else n
    phases = 2 if params.bits == 4 and packed_axis % 2 == 0 else 1
    if phases == 2:
        w = as_bytes(w)
        if transpose:
            x = jnp.concatenate([x[:, 0::2], x[:, 1::2]], axis=1)
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
    out_phases = 1 if transpose else phases
    partial = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((tiling.splits, out_phases, rows, n // out_phases), jnp.float32),
        grid=(pl.cdiv(n, tiling.block_n), tiling.splits, row_blocks),
        compiler_params=plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=tiling.num_stages),
        interpret=tiling.interpret,
        name="ejkernel_quantized_matmul",
    )(*operands)
    out = partial.sum(axis=0)  # [phases, rows, N / phases]: column c of phase p is output column c · phases + p
    return jnp.moveaxis(out, 0, -1).reshape(rows, n)[:m]
