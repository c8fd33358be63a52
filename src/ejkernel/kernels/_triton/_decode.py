"""Decoding packed weights inside Pallas-Triton kernels: one tile of a matrix packed by `ejkernel.quantization`
turned into float32 values in registers, for the kernels that multiply by it (quantized and grouped matmul).

A packed matrix has rows R and unpacked columns C: `w [..., R, ceil(C·b/32)]` uint32 words of `b`-bit codes
(LSB first), except 8-bit codes, which the kernels read as their bytes `[..., R, C]` (`byte_codes`: uint8, or
float8 for E4M3); `scales [..., R, C/g]` (and affine `zeros`) per group of g columns. `decode_tile` loads one
tile whole along the packed axis (contiguous), splits each word into its `32 / b` codes (a shift per code
position, then a reshape that lays the codes out in column order; bytes are codes already) and decodes them
with the group's metadata broadcast over the group: affine `q·s + (−z·s)` (one fused multiply-add a value); NF4
a lookup in a 16-entry table; E2M1 codes by assembling the float32's bits, E4M3 codes by the hardware's
conversion of float8; mx scales `2^e` from the exponent byte, nv scales decoded as E4M3 (`e4m3`). All metadata
arithmetic runs on the `[rows, groups]` tile before it is broadcast.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.kernels._common.code_bits import as_bytes, e2m1, e4m3, pow2
from ejkernel.quantization.modes import QuantParams


def byte_codes(w, params: QuantParams):
    """8-bit codes' words `w [..., R, C/4]` viewed as bytes `[..., R, C]` (`as_bytes`), so `decode_tile` loads
    codes whole instead of splitting words (no shifts, no interleaving reshape). E4M3 codes (mxfp8, nvfp8) are
    viewed as float8_e4m3fn, which the GPU converts in one instruction; affine codes as uint8. Other widths: `w`
    unchanged."""
    if params.bits != 8:
        return w
    return as_bytes(w, jnp.uint8 if params.mode == "affine" else jnp.float8_e4m3fn)


def masked_load(ref, index, mask):
    """`ref[index]`, zeros where `mask` (None: nothing masked) is False."""
    if mask is None:
        return ref[index]
    return plgpu.load(ref.at[index], mask=mask, other=0)


@dataclasses.dataclass(frozen=True)
class WeightTile:
    """Where one tile of the packed matrix lies: `rows` packed rows from block `row_block`, `cols` unpacked
    columns from block `col_block`; `row_count` and `col_count` are the matrix's (for masking a partial tile)."""

    row_block: jax.Array
    rows: int
    row_count: int
    col_block: jax.Array
    cols: int
    col_count: int


def decode_tile(
    w_ref, s_ref, z_ref, table_ref, tile: WeightTile, params: QuantParams, prefix: tuple = (), nibble: int | None = None
):
    """float32 `[rows, cols]` values of one tile of the packed matrix `w_ref[*prefix]` (`prefix`: leading
    indices, e.g. a group's; `z_ref` affine only, `table_ref` the NF4 table for nf4 only). `cols` must hold whole
    groups or lie inside one, and be a multiple of `32 / bits` where `w_ref` holds words.

    `nibble` (0 or 1): `w_ref` holds the bytes of 4-bit codes (`as_bytes`) and the tile is the matrix of every
    byte's low (0) or high (1) code: the even or the odd columns of the packed matrix, whose groups are half as
    wide (`params.group_size` must say so)."""
    bits, g = params.bits, params.group_size
    per_word = 1 if jnp.dtype(w_ref.dtype).itemsize == 1 else 32 // bits  # `byte_codes`' view: a byte a code
    if bits == 8 and per_word != 1:
        raise ValueError(f"8-bit codes come as bytes (byte_codes), got words of {w_ref.dtype}")
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
    packed = masked_load(w_ref, (*prefix, pl.ds(row0, tile.rows), pl.ds(word0, words)), mask(word_ok))
    if nibble is not None:
        codes = ((packed >> (4 * nibble)) & 0xF).astype(jnp.int32)
    elif per_word == 1:
        codes = packed  # uint8 codes, or float8 values
    else:
        shifts = jnp.arange(per_word, dtype=jnp.uint32) * bits
        codes = (packed[:, :, None] >> shifts[None, None, :]) & jnp.uint32((1 << bits) - 1)
        codes = codes.reshape(tile.rows, tile.cols).astype(jnp.int32)  # code i of a row is column i

    if tile.cols >= g:  # whole groups in the tile: metadata [rows, groups], broadcast over each group below
        groups = tile.cols // g
        group0 = pl.multiple_of(tile.col_block * groups, groups)
        group_ok = group0 + jnp.arange(groups) < tile.col_count // g if ragged_cols else None
        meta_index, meta_mask = (*prefix, pl.ds(row0, tile.rows), pl.ds(group0, groups)), mask(group_ok)
    else:  # the tile lies inside one group: metadata [rows, 1]
        groups = 1
        group = lax.div(tile.col_block * tile.cols, jnp.int32(g))
        meta_index, meta_mask = (*prefix, pl.ds(row0, tile.rows), pl.ds(group, 1)), row_ok

    def spread(meta):
        """`[rows, groups]` metadata to `[rows, cols]`, each group's value over its columns."""
        if groups == 1:
            return meta
        return jnp.broadcast_to(meta[:, :, None], (tile.rows, groups, g)).reshape(tile.rows, tile.cols)

    scales = masked_load(s_ref, meta_index, meta_mask)
    if params.mode == "affine":
        scales = scales.astype(jnp.float32)
        offsets = -masked_load(z_ref, meta_index, meta_mask).astype(jnp.float32) * scales
        return codes.astype(jnp.float32) * spread(scales) + spread(offsets)
    if params.mode == "nf4":
        return table_ref[codes] * spread(scales.astype(jnp.float32))
    values = codes.astype(jnp.float32) if bits == 8 else e2m1(codes)  # 8-bit: float8 (`byte_codes`)
    scales = scales.astype(jnp.int32)
    factors = pow2(scales) if params.mode.startswith("mx") else e4m3(scales)
    return values * spread(factors)
