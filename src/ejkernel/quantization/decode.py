"""`dequantize`: packed codes and per-group metadata back to floats, in the layout `quantize` grouped."""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.quantization import codes as C
from ejkernel.quantization.modes import QuantParams, packed_words, resolve_axis, resolve_params
from ejkernel.quantization.packing import unpack_codes
from ejkernel.quantization.runtime import resolve_runtime


def check_packed(w_q, scales, zeros, params: QuantParams, names=("w_q", "scales", "zeros")) -> None:
    """Dtypes and shapes of packed weights and metadata: `ValueError` naming the argument that is wrong."""
    w_name, s_name, z_name = names
    if jnp.dtype(w_q.dtype) != jnp.uint32:
        raise ValueError(f"{w_name} must be uint32 (packed codes), got dtype {w_q.dtype}")
    if params.float_scales and not jnp.issubdtype(scales.dtype, jnp.floating):
        raise ValueError(f"{s_name} must be floating-point for mode {params.mode!r}, got dtype {scales.dtype}")
    if not params.float_scales and jnp.dtype(scales.dtype) != jnp.uint8:
        raise ValueError(f"{s_name} must be uint8 codes for mode {params.mode!r}, got dtype {scales.dtype}")
    if params.mode == "affine":
        if zeros is None:
            raise ValueError(f"{z_name} is required for mode 'affine'")
        if not jnp.issubdtype(zeros.dtype, jnp.floating):
            raise ValueError(f"{z_name} must be floating-point, got dtype {zeros.dtype}")
        if zeros.shape != scales.shape:
            raise ValueError(
                f"{z_name} must have the shape of {s_name} {tuple(scales.shape)}, got {tuple(zeros.shape)}"
            )
    elif zeros is not None:
        raise ValueError(f"{z_name} must be None for mode {params.mode!r} (only affine has zero points)")
    if w_q.ndim < 1 or scales.ndim != w_q.ndim or w_q.shape[:-1] != scales.shape[:-1]:
        raise ValueError(
            f"{w_name} {tuple(w_q.shape)} and {s_name} {tuple(scales.shape)} must agree on every dim but the last"
        )
    n = scales.shape[-1] * params.group_size
    if w_q.shape[-1] != packed_words(n, params.bits):
        raise ValueError(
            f"{w_name} must have {packed_words(n, params.bits)} words per row for {n} values of {params.bits} bits "
            f"({s_name} has {scales.shape[-1]} groups of {params.group_size}), got {w_q.shape[-1]}"
        )


@functools.partial(jax.jit, static_argnames=("params", "dtype", "unpack"))
def decode_layout(w_q, scales, zeros, params: QuantParams, dtype=jnp.float32, unpack: str = "auto") -> jax.Array:
    """Values `[..., R, n_groups * g]` of checked packed weights, computed in `dtype`.

    affine `(q - z) * s`, nf4 `NF4[q] * s`, mx* `val(q) * 2^int8(byte)` (the power of two applied exactly in
    float32), nv* `val(q) * e4m3(byte)`.
    """
    g = params.group_size
    lead, num_groups = scales.shape[:-1], scales.shape[-1]
    q = unpack_codes(w_q, params.bits, num_groups * g, unpack).reshape(*lead, num_groups, g)
    if params.mode == "affine":
        s, z = scales.astype(dtype)[..., None], zeros.astype(dtype)[..., None]
        values = (q.astype(dtype) - z) * s
    elif params.mode == "nf4":
        values = C.decode(q, "nf4", dtype) * scales.astype(dtype)[..., None]
    elif params.mode.startswith("mx"):
        exponent = lax.bitcast_convert_type(scales, jnp.int8)[..., None]
        values = C.times_pow2(C.decode(q, params.codebook), exponent).astype(dtype)
    else:
        values = C.decode(q, params.codebook, dtype) * C.decode(scales, "e4m3", dtype)[..., None]
    return values.reshape(*lead, num_groups * g)


def dequantize(w_q, scales, zeros=None, *, group_size=None, bits=None, mode="affine", axis="row", runtime_config=None):
    """Packed codes and group metadata back to values, in the layout `quantize` grouped.

    Each value is decoded from its code q and its group's metadata: affine `(q - z) · s`, nf4 `NF4[q] · s`,
    mx modes `val(q) · 2^int8(byte)` (the power of two applied exactly in float32), nv modes
    `val(q) · e4m3(byte)`. `axis` is checked and otherwise ignored, as upstream:
    `dequantize(*quantize(w, axis="row"))` is `w` with its last two axes swapped. Plain JAX, differentiable
    with respect to floating `scales` and `zeros`.

    Args:
        w_q: `[..., R, words]` uint32 packed codes, `words = ceil(n_groups · group_size · bits / 32)`.
        scales: `[..., R, n_groups]`: float for affine and nf4, uint8 for mx and nv modes.
        zeros: `[..., R, n_groups]` float, required for affine; None (default) for the other modes.
        group_size: As given to `quantize`; None (default): the mode's default.
        bits: As given to `quantize`; None (default): 4 for affine.
        mode: As given to `quantize` (default `"affine"`).
        axis: `"row"` (default) or `"col"`; checked, otherwise ignored.
        runtime_config: A `QuantRuntimeConfig` (the arithmetic's and the result's dtypes, the unpacking
            strategy); None (default): its defaults, float32 throughout.

    Returns:
        `[..., R, n_groups · group_size]` values, leading dims following `scales`, float32 unless
        `runtime_config` says otherwise.

    Raises:
        ValueError: `mode`, `group_size`, `bits` or `axis` outside its domain; `w_q` not uint32; `scales` or
            `zeros` of the wrong dtype for the mode; `zeros` missing for affine or given for another mode,
            or not shaped like `scales`; `w_q` and `scales` disagreeing on a leading dim, or a word count
            that does not fit `scales`; a bad `runtime_config` (or its `"fast"` unpacking with bits not
            dividing 32).

    Example:
        >>> import numpy as np
        >>> from ejkernel.quantization import dequantize, quantize
        >>> w = np.tile(np.arange(16, dtype=np.float32), (8, 4))  # [8, 64]: groups span 0..15, exact in 4 bits
        >>> w_hat = dequantize(*quantize(w, axis="col"))
        >>> print(w_hat.shape, w_hat.dtype, bool((w_hat == w).all()))
        (8, 64) float32 True
        >>> bool((dequantize(*quantize(w.T)) == w).all())  # axis="row" swapped the last two axes
        True
    """
    params = resolve_params(mode, group_size, bits)
    resolve_axis(axis)
    runtime = resolve_runtime(runtime_config)
    w_q, scales = jnp.asarray(w_q), jnp.asarray(scales)
    zeros = None if zeros is None else jnp.asarray(zeros)
    check_packed(w_q, scales, zeros, params)
    values = decode_layout(w_q, scales, zeros, params, runtime.compute_dtype, runtime.dequant_unpack_policy)
    return values.astype(runtime.output_dtype)
