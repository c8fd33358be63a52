"""Decoding packed weights inside Pallas-Triton kernels: one tile of a matrix packed by `ejkernel.quantization`
turned into float32 values in registers, for the kernels that multiply by it (quantized and grouped matmul).

A packed matrix has rows R and unpacked columns C: `w [..., R, ceil(C·b/32)]` uint32 words of `b`-bit codes
(LSB first), `scales [..., R, C/g]` (and affine `zeros`) per group of g columns. `decode_tile` loads one tile
whole along the packed axis (contiguous words), splits each word into its `32 / b` codes (a shift per code
position, then a reshape that lays the codes out in column order) and decodes them with the group's metadata
broadcast over the group: affine `q·s + (−z·s)` (one fused multiply-add a value); NF4 a lookup in a 16-entry
table; E2M1 and E4M3 codes by assembling the float32's bits; mx scales `2^e` from the exponent byte, nv scales
decoded as E4M3. All metadata arithmetic runs on the `[rows, groups]` tile before it is broadcast.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ejkernel.quantization.modes import QuantParams


def _bits_to_float(bits):
    return lax.bitcast_convert_type(bits, jnp.float32)


def e2m1(codes):
    """float32 value of FP4 E2M1 codes (int32): sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0."""
    exponent, mantissa = (codes >> 1) & 3, codes & 1
    normal = ((exponent + 126) << 23) | (mantissa << 22)
    subnormal = mantissa * (126 << 23)  # exponent 0: 0 or 0.5
    return _bits_to_float(jnp.where(exponent == 0, subnormal, normal) | ((codes & 8) << 28))


def e4m3(codes):
    """float32 value of FP8 E4M3 (FN) codes (int32): sign bit 7, exponent bits 6-3 (bias 7), 0x7F NaN."""
    exponent, mantissa = (codes >> 3) & 15, codes & 7
    normal = _bits_to_float(((exponent + 120) << 23) | (mantissa << 20))
    magnitude = jnp.where(exponent == 0, mantissa.astype(jnp.float32) * 2.0**-9, normal)
    magnitude = jnp.where((codes & 0x7F) == 0x7F, jnp.nan, magnitude)
    return jnp.where((codes & 0x80) != 0, -magnitude, magnitude)


def pow2(byte):
    """float32 `2^e` for the two's-complement exponent byte `e` (int32 0..255), from two normal halves."""
    exponent = jnp.where(byte >= 128, byte - 256, byte)
    half = exponent >> 1
    return _bits_to_float((half + 127) << 23) * _bits_to_float((exponent - half + 127) << 23)


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


def _tile_rows(tile: WeightTile):
    """The tile's first packed row and its row mask (`[rows, 1]`; None where the tile lies inside the matrix)."""
    row0 = pl.multiple_of(tile.row_block * tile.rows, tile.rows)
    if tile.row_count % tile.rows:
        return row0, (row0 + jnp.arange(tile.rows) < tile.row_count)[:, None]
    return row0, None


def _and(row_ok, cols_ok):
    if cols_ok is None:
        return row_ok
    return cols_ok[None, :] if row_ok is None else row_ok & cols_ok[None, :]


def load_words(w_ref, tile: WeightTile, bits: int, prefix: tuple = ()):
    """uint32 `[rows, cols·bits/32]` packed words of one tile of `w_ref[*prefix]` (zero outside the matrix).
    `cols` must be a multiple of `32 / bits`."""
    per_word = 32 // bits
    words = tile.cols // per_word
    row0, row_ok = _tile_rows(tile)
    word0 = pl.multiple_of(tile.col_block * words, words)
    word_ok = word0 + jnp.arange(words) < tile.col_count // per_word if tile.col_count % tile.cols else None
    return masked_load(w_ref, (*prefix, pl.ds(row0, tile.rows), pl.ds(word0, words)), _and(row_ok, word_ok))


def load_codes(w_ref, tile: WeightTile, bits: int, prefix: tuple = ()):
    """int32 `[rows, cols]` codes of one tile of `w_ref[*prefix]`, code i of a row in column i (zero outside
    the matrix). `cols` must be a multiple of `32 / bits`."""
    packed = load_words(w_ref, tile, bits, prefix)
    shifts = jnp.arange(32 // bits, dtype=jnp.uint32) * bits
    codes = (packed[:, :, None] >> shifts[None, None, :]) & jnp.uint32((1 << bits) - 1)
    return codes.reshape(tile.rows, tile.cols).astype(jnp.int32)


def group_metadata(ref, tile: WeightTile, group_size: int, prefix: tuple = ()):
    """`[rows]` metadata (`ref`: scales or zeros) of the one group the tile's columns lie in (`cols <= g`),
    zero for rows outside the matrix."""
    row0, row_ok = _tile_rows(tile)
    group = lax.div(tile.col_block * tile.cols, jnp.int32(group_size))
    index = (*prefix, pl.ds(row0, tile.rows), group)
    return masked_load(ref, index, None if row_ok is None else row_ok[:, 0])


def code_values(codes, params: QuantParams, table_ref):
    """float32 values of the codes before their group's scale: affine the code itself, NF4 its table entry
    (`table_ref`), E2M1 / E4M3 the float the bits spell."""
    if params.mode == "affine":
        return codes.astype(jnp.float32)
    if params.mode == "nf4":
        return table_ref[codes]
    return e2m1(codes) if params.bits == 4 else e4m3(codes)


def scale_factors(scales, params: QuantParams):
    """float32 factors of stored scales: float scales as they are, mx exponent bytes `2^e`, nv E4M3 codes."""
    if params.float_scales:
        return scales.astype(jnp.float32)
    scales = scales.astype(jnp.int32)
    return pow2(scales) if params.mode.startswith("mx") else e4m3(scales)


MAGIC = {jnp.dtype(jnp.float32): (0x4B000000, 23), jnp.dtype(jnp.bfloat16): (0x4300, 7)}
MAGIC[jnp.dtype(jnp.float16)] = (0x6400, 10)
"""dtype -> (bits of the power of two P whose ulp is 1, mantissa bits): `P | code` spells `P + code` exactly for
codes below `2^mantissa bits`."""


def magic_offset(dtype, bits: int) -> int:
    """The offset P that `integer_codes(..., keep_offset=True)` leaves in `dtype` values of `bits`-bit codes:
    2^mantissa bits where the codes fit the mantissa of `dtype`'s 16-bit or 32-bit word, else 0 (no offset)."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float32 or bits > MAGIC[dtype][1]:
        return 0
    return 1 << MAGIC[dtype][1]


def integer_codes(codes, dtype, bits: int, keep_offset: bool):
    """`[rows, cols]` `dtype` values of non-negative integer codes (int32, below `2^bits`), exact, without an
    int -> float conversion: each code OR'ed into the mantissa of a power of two P whose ulp is 1 spells
    `P + code`. With `keep_offset` and `magic_offset(dtype, bits)` nonzero the result is `P + code` in `dtype`
    itself (one OR a value; the caller subtracts P where it is cheaper, e.g. in a zero point); otherwise P is
    subtracted in float32 (exact) and the codes rounded to `dtype` (exact: codes have at most 8 bits)."""
    offset = magic_offset(dtype, bits)
    if keep_offset and offset:
        spelled = (codes | MAGIC[jnp.dtype(dtype)][0]).astype(jnp.uint16)
        return lax.bitcast_convert_type(spelled, dtype)
    spelled = _bits_to_float(codes | MAGIC[jnp.dtype(jnp.float32)][0]) - float(1 << 23)
    return spelled.astype(dtype)


def decode_tile(
    w_ref, s_ref, z_ref, table_ref, tile: WeightTile, params: QuantParams, prefix: tuple = (), magic: bool = False
):
    """float32 `[rows, cols]` values of one tile of the packed matrix `w_ref[*prefix]` (`prefix`: leading
    indices, e.g. a group's; `z_ref` affine only, `table_ref` the NF4 table for nf4 only). `cols` must be a
    multiple of `32 / bits`, and hold whole groups or lie inside one. `magic`: affine codes to float32 by
    `integer_codes` rather than an int -> float conversion (the same values)."""
    g = params.group_size
    codes = load_codes(w_ref, tile, params.bits, prefix)
    row0, row_ok = _tile_rows(tile)
    ragged_cols = tile.col_count % tile.cols != 0

    if tile.cols >= g:  # whole groups in the tile: metadata [rows, groups], broadcast over each group below
        groups = tile.cols // g
        group0 = pl.multiple_of(tile.col_block * groups, groups)
        group_ok = group0 + jnp.arange(groups) < tile.col_count // g if ragged_cols else None
        meta_index, meta_mask = (*prefix, pl.ds(row0, tile.rows), pl.ds(group0, groups)), _and(row_ok, group_ok)
    else:  # the tile lies inside one group: metadata [rows, 1]
        groups = 1
        group = lax.div(tile.col_block * tile.cols, jnp.int32(g))
        meta_index, meta_mask = (*prefix, pl.ds(row0, tile.rows), pl.ds(group, 1)), row_ok

    def spread(meta):
        """`[rows, groups]` metadata to `[rows, cols]`, each group's value over its columns."""
        if groups == 1:
            return meta
        return jnp.broadcast_to(meta[:, :, None], (tile.rows, groups, g)).reshape(tile.rows, tile.cols)

    factors = scale_factors(masked_load(s_ref, meta_index, meta_mask), params)
    if params.mode == "affine":
        offsets = -masked_load(z_ref, meta_index, meta_mask).astype(jnp.float32) * factors
        values = integer_codes(codes, jnp.float32, params.bits, False) if magic else codes.astype(jnp.float32)
        return values * spread(factors) + spread(offsets)
    return code_values(codes, params, table_ref) * spread(factors)


def _in_column_order(parts):
    """`[..., n]` from n same-shaped arrays (`parts[i]` at position i; n a power of two) by two-way stacks along a
    new last axis (Triton's join, free in registers): pairing `i` with `i + n/2` level by level makes the first
    level's axis the slowest, so the flattened order is i's."""
    count = len(parts)
    while len(parts) > 1:
        half = len(parts) // 2
        parts = [jnp.stack([parts[i], parts[i + half]], axis=-1) for i in range(half)]
    return parts[0].reshape(*parts[0].shape[: -(count.bit_length() - 1)], count)


def spelled_code_pairs(packed, bits: int, dtype):
    """`[rows, words·32/bits]` `dtype` (16-bit) values `P + code` of packed words' codes in column order, two
    codes a 32-bit operation: `(word >> j·b) & mask | P·0x10001` holds code j spelled in its low half and code
    `j + 16/b` in its high half (`integer_codes`' P; the codes must fit the mantissa: `magic_offset` nonzero)."""
    ones = jnp.uint32(0x10001)  # a 16-bit value in both halves of a word
    mask, magic = jnp.uint32((1 << bits) - 1) * ones, jnp.uint32(MAGIC[jnp.dtype(dtype)][0]) * ones
    low, high = [], []
    for j in range(16 // bits):
        spelled = ((packed >> jnp.uint32(j * bits)) & mask) | magic
        low.append(lax.bitcast_convert_type(spelled.astype(jnp.uint16), dtype))
        high.append(lax.bitcast_convert_type((spelled >> jnp.uint32(16)).astype(jnp.uint16), dtype))
    values = _in_column_order(low + high)  # [rows, words, 2, ...]: code i of a word at flattened position i
    return values.reshape(packed.shape[0], packed.shape[1] * 32 // bits)
