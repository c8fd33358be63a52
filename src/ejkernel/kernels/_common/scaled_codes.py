"""8-bit codes with one scale per row, shared by the quantised KV caches and FP8 x FP8 grouped matmul: a row's
values divided by `max|x| / code max` and rounded into float8 or int8."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def code_max(dtype) -> float:
    """The largest code of `dtype`: 127 for int8, the float8 format's largest finite."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return float(jnp.iinfo(dtype).max)
    return float(jnp.finfo(dtype).max)


def to_codes(x, dtype) -> jax.Array:
    """`x` (already divided by its scale) as codes of `dtype`: saturated to the format's range (an overflow would
    be inf or NaN in float8) and, for int8, rounded and clipped to `[-127, 127]`."""
    top = code_max(dtype)
    x = jnp.clip(x, -top, top)
    return (jnp.round(x) if jnp.issubdtype(jnp.dtype(dtype), jnp.integer) else x).astype(dtype)


def code_values(codes, dtype=jnp.float32) -> jax.Array:
    """The values of `codes` (int8, float8, or a 16/32-bit float) in `dtype`. float8 codes are looked up in a
    table of the format's 256 values: on a GPU, XLA (under its default `xla_allow_excess_precision`) rewrites a
    chain of float conversions such as float32 -> float8 -> float32 into no conversion at all, which would drop
    the rounding that made the codes. Other codes convert directly."""
    codes_dtype = jnp.dtype(codes.dtype)
    if jnp.issubdtype(codes_dtype, jnp.integer) or codes_dtype.itemsize > 1:
        return codes.astype(dtype)
    table = np.arange(256, dtype=np.uint8).view(codes_dtype).astype(np.float32)
    return jnp.asarray(table)[lax.bitcast_convert_type(codes, jnp.uint8)].astype(dtype)


def quantize_rows(x, dtype) -> tuple[jax.Array, jax.Array]:
    """`(codes, scales)`: rows `x [..., D]` quantised to `dtype` (float8 or int8) with one float32 scale per row,
    `max|x| / code_max(dtype)` over the last axis (a zero row gets 1), so `code * scale` gives the row back
    within the format's rounding."""
    x = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=-1)
    scales = jnp.where(amax > 0, amax / code_max(dtype), 1.0)
    return to_codes(x / scales[..., None], dtype), scales
