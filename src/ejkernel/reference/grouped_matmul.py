"""Reference grouped matmul: one float32 matmul per group, in a Python loop over concrete group sizes."""

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.reference.quantized_matmul import dequantize_reference


def grouped_matmul_reference(
    lhs,
    rhs,
    group_sizes,
    group_offset=None,
    existing_out=None,
    *,
    preferred_element_type=jnp.float32,
    rhs_scale=None,
    rhs_bias=None,
    transpose_rhs: bool = False,
    fp8_lhs: bool = False,
):
    """`out [M, N]`: the rows of each group of `lhs [M, K]` times that group's `rhs`, in float32.

    Groups are laid out back to back: group g holds rows `[sum(sizes[:g]), sum(sizes[:g+1]))`.
    `rhs` is `[L, K, N]` (`[L, N, K]` with `transpose_rhs`) and holds groups `o .. o + L - 1` of
    `group_sizes`, `o = group_offset` (default 0). For each held group g (local index l = g - o):

        w = rhs[l]  (transposed when transpose_rhs)
        w[k, n] *= rhs_scale[l, k // (K / blocks), 0, n]    when rhs_scale is given
        out[rows of g] = lhs[rows of g] @ w + rhs_bias[l, 0]  (bias when given)

    Every other row (groups not held, rows past the last group) is 0. Then `existing_out`, cast to
    `preferred_element_type`, is added to every row (upstream's accumulation). The result has dtype
    `preferred_element_type` (float32 for None). `group_sizes` and `group_offset` must be concrete.

    `rhs` may be a `QuantizedArray` of `w [L, K, N]` (`[L, N, K]` with `transpose_rhs`), made by
    `quantize_array(w, axis=...)`: it is dequantized back to `w` first (its packed layout is `w`'s last two
    axes as they are for `axis="col"`, swapped for `axis="row"`).

    `fp8_lhs` (with `rhs_scale` of `blocks` K blocks): lhs is first rounded through float8_e4m3fn, each row's
    K block divided by its `absmax / 448` (1 when all zero), rounded, and multiplied back; the gradient
    passes straight through the rounding.
    """
    x = jnp.asarray(lhs, jnp.float32)
    if fp8_lhs:
        x = _through_fp8(x, x.shape[1] // rhs_scale.shape[1])
    w = _dequantized(rhs) if hasattr(rhs, "scales") else jnp.asarray(rhs, jnp.float32)
    if transpose_rhs:
        w = jnp.swapaxes(w, 1, 2)
    if rhs_scale is not None:
        scale = jnp.asarray(rhs_scale, jnp.float32)[:, :, 0, :]  # [L, blocks, N]
        w = w * jnp.repeat(scale, w.shape[1] // scale.shape[1], axis=1)
    sizes = np.asarray(group_sizes)
    offset = 0 if group_offset is None else int(np.asarray(group_offset).reshape(()))
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    out_dtype = jnp.float32 if preferred_element_type is None else preferred_element_type
    out = jnp.zeros((x.shape[0], w.shape[2]), jnp.float32)
    for local in range(w.shape[0]):
        start, end = int(bounds[offset + local]), int(bounds[offset + local + 1])
        rows = jnp.matmul(x[start:end], w[local], precision=jax.lax.Precision.HIGHEST)
        if rhs_bias is not None:
            rows = rows + jnp.asarray(rhs_bias, jnp.float32)[local, 0]
        out = out.at[start:end].set(rows)
    if existing_out is not None:
        out = out + jnp.asarray(existing_out).astype(out_dtype).astype(jnp.float32)
    return out.astype(out_dtype)


def _dequantized(rhs):
    """float32 `w` of a `QuantizedArray` (duck-typed: `data`, `scales`, `zeros` and its format; concrete), per
    group."""
    data, scales = np.asarray(rhs.data), np.asarray(rhs.scales)
    zeros = [None] * data.shape[0] if rhs.zeros is None else np.asarray(rhs.zeros)
    layout = [
        dequantize_reference(d, s, z, group_size=rhs.group_size, bits=rhs.bits, mode=rhs.mode)
        for d, s, z in zip(data, scales, zeros, strict=True)
    ]
    w = jnp.asarray(np.stack(layout), jnp.float32)
    return jnp.swapaxes(w, 1, 2) if rhs.axis == "row" else w


def _through_fp8(x, block: int):
    """float32 `x [M, K]` rounded to float8_e4m3fn per row and block of K values, then scaled back; identity
    gradient."""
    m, k = x.shape
    blocks = x.reshape(m, k // block, block)
    scale = jnp.max(jnp.abs(blocks), axis=-1, keepdims=True) / 448.0
    scale = jnp.where(scale == 0, 1.0, scale)
    codes = jax.lax.bitcast_convert_type((blocks / scale).astype(jnp.float8_e4m3fn), jnp.uint8)
    values = np.arange(256, dtype=np.uint8).view(jnp.float8_e4m3fn).astype(np.float32)  # a lookup: XLA on a GPU
    rounded = (jnp.asarray(values)[codes] * scale).reshape(m, k)  # drops a float32 -> float8 -> float32 chain
    return x + jax.lax.stop_gradient(rounded - x)
