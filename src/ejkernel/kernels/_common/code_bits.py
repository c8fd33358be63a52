"""Minifloat codes and packed words taken apart by their bits in plain jnp, so that any kernel (Pallas-Triton,
Mosaic GPU) can decode them in registers where its compiler has no conversion for the format: FP4 E2M1 and FP8 E4M3
values, mx scales' `2^e`, and packed 32-bit words viewed as their bytes."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


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


def as_bytes(words, dtype=jnp.uint8):
    """Packed words `[..., R, W]` viewed as their bytes `[..., R, 4 W]` of `dtype` (a bitcast, no copy): byte i of a
    little-endian word holds its lowest bits but 8 i, so codes keep their column order."""
    return lax.bitcast_convert_type(words, dtype).reshape(*words.shape[:-1], 4 * words.shape[-1])
