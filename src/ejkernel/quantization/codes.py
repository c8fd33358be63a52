"""Code tables (NF4, E2M1, E4M3) and the encoders that map a float to its nearest code.

"Nearest" never picks a NaN code, so values past the largest magnitude saturate; an exact midpoint
between two magnitudes goes to the smaller one; values that round to zero get the +0 code.
"""

import jax.numpy as jnp
import numpy as np
from jax import lax

NF4 = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    np.float32,
)
"""The QLoRA NormalFloat-4 codebook, index = code (ascending)."""


def _minifloat(code: int, exponent_bits: int, mantissa_bits: int, bias: int) -> float:
    """Value of a sign / exponent / mantissa code (subnormal when the exponent field is 0)."""
    sign = -1.0 if code >> (exponent_bits + mantissa_bits) else 1.0
    exponent = (code >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = code & ((1 << mantissa_bits) - 1)
    scale = 1 << mantissa_bits
    if exponent == 0:
        return sign * mantissa / scale * 2.0 ** (1 - bias)
    return sign * (1 + mantissa / scale) * 2.0 ** (exponent - bias)


E2M1 = np.array([_minifloat(c, 2, 1, 1) for c in range(16)], np.float32)
"""FP4 E2M1: codes 0..7 are 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign."""

E4M3 = np.array([np.nan if c & 0x7F == 0x7F else _minifloat(c, 4, 3, 7) for c in range(256)], np.float32)
"""FP8 E4M3 (FN): bit 7 is the sign, 0x7F and 0xFF are NaN, 0x7E = 448 is the largest finite value."""

E2M1_MAX, E4M3_MAX = 6.0, 448.0
SIGN_BIT = {"e2m1": 3, "e4m3": 7}
TABLES = {"nf4": NF4, "e2m1": E2M1, "e4m3": E4M3}
MAGNITUDES = {"e2m1": E2M1[:8], "e4m3": E4M3[:0x7F]}
"""Non-negative values of each minifloat by code, ascending (NaN codes left out)."""


def _midpoints(values: np.ndarray) -> jnp.ndarray:
    return jnp.asarray((values[:-1] + values[1:]) / 2, jnp.float32)


def nearest_index(v: jnp.ndarray, values: np.ndarray, threshold: bool = True) -> jnp.ndarray:
    """uint32 index of the entry of ascending `values` nearest to each `v`, ties to the lower index.

    `threshold=True` counts the midpoints below `v` (a binary search); `False` takes the smallest
    distance to every entry (memory `|values|` times `v`'s): the same codes, by a second route.
    """
    if threshold:
        return jnp.searchsorted(_midpoints(values), v, side="left").astype(jnp.uint32)
    distance = jnp.abs(v[..., None] - jnp.asarray(values))
    return jnp.argmin(distance, axis=-1).astype(jnp.uint32)


def encode(v: jnp.ndarray, codebook: str, threshold: bool = True) -> jnp.ndarray:
    """uint32 code of `codebook` (`"nf4"`, `"e2m1"`, `"e4m3"`) nearest to each float32 `v`."""
    if codebook == "nf4":
        return nearest_index(v, NF4, threshold)
    magnitude = nearest_index(jnp.abs(v), MAGNITUDES[codebook], threshold)
    negative = (v < 0) & (magnitude > 0)
    return magnitude | (negative.astype(jnp.uint32) << SIGN_BIT[codebook])


def decode(codes: jnp.ndarray, codebook: str, dtype=jnp.float32) -> jnp.ndarray:
    """Value of each code (any integer dtype) of `codebook`, in `dtype`."""
    return jnp.take(jnp.asarray(TABLES[codebook], dtype), codes.astype(jnp.int32), mode="clip")


def exp2_int(k: jnp.ndarray) -> jnp.ndarray:
    """Exactly `2**k` in float32 for integer `k` in [-126, 127], built from its bits."""
    return lax.bitcast_convert_type((k.astype(jnp.int32) + 127).astype(jnp.uint32) << 23, jnp.float32)


def times_pow2(x: jnp.ndarray, e: jnp.ndarray) -> jnp.ndarray:
    """`x * 2**e` for float32 `x` and integer `e` in [-128, 128], in two exact steps of at most 2**64."""
    e = e.astype(jnp.int32)
    half = e >> 1
    return x * exp2_int(half) * exp2_int(e - half)


def ceil_log2(r: jnp.ndarray) -> jnp.ndarray:
    """int32 `ceil(log2(r))` for positive float32 `r` (exact: from the exponent and the mantissa); 0 at r = 0."""
    mantissa, exponent = jnp.frexp(r)  # r = mantissa * 2**exponent, mantissa in [0.5, 1)
    return jnp.where(mantissa == 0.5, exponent - 1, exponent).astype(jnp.int32)
