"""`quantize` and `prepack_quantized_weights`: groups of float weights to packed codes and per-group metadata.

Statistics are computed in float32 whatever the input dtype, and codes are computed from the metadata
as stored (after rounding to its dtype), so `dequantize` sees exactly the scales the codes were made for.
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.quantization import codes as C
from ejkernel.quantization.modes import QuantParams, resolve_axis, resolve_params
from ejkernel.quantization.packing import pack_codes
from ejkernel.quantization.runtime import QuantRuntimeConfig, resolve_runtime


def _nonzero(s: jnp.ndarray) -> jnp.ndarray:
    return jnp.where(s == 0, jnp.ones_like(s), s)


def _affine(groups, bits: int, metadata_dtype):
    """Codes `clip(round_half_even(G/s + z), 0, 2^b - 1)`, `s = range / (2^b - 1)` (1 for a constant group,
    or where the metadata dtype underflows it), `z = -min/s` (fractional)."""
    qmax = (1 << bits) - 1
    lo, hi = groups.min(axis=-1), groups.max(axis=-1)
    scale = _nonzero(_nonzero((hi - lo) / qmax).astype(metadata_dtype))
    zero = (-lo / scale.astype(jnp.float32)).astype(metadata_dtype)
    s, z = scale.astype(jnp.float32)[..., None], zero.astype(jnp.float32)[..., None]
    codes = jnp.clip(jnp.round(groups / s + z), 0, qmax).astype(jnp.uint32)
    return codes, scale, zero


def _nf4(groups, scale_dtype, threshold: bool):
    """Codes of the NF4 value nearest `G / max|G|` (scale 1 for an all-zero group)."""
    scale = _nonzero(jnp.abs(groups).max(axis=-1).astype(scale_dtype))
    return C.encode(groups / scale.astype(jnp.float32)[..., None], "nf4", threshold), scale


def _mx(groups, codebook: str, threshold: bool):
    """Shared exponent `e = ceil(log2(max|G| / vmax))` (0 for an all-zero group), clipped to [-128, 127] and
    stored as a two's-complement int8 byte; codes of `G * 2^-e`."""
    vmax = C.E2M1_MAX if codebook == "e2m1" else C.E4M3_MAX
    exponent = jnp.clip(C.ceil_log2(jnp.abs(groups).max(axis=-1) / vmax), -128, 127)
    codes = C.encode(C.times_pow2(groups, -exponent[..., None]), codebook, threshold)
    return codes, (exponent & 0xFF).astype(jnp.uint8)


def _nv(groups, codebook: str, threshold: bool):
    """Scale code `σ`: the E4M3 code nearest `max|G| / vmax`, at least 0x01 (2^-9) for a nonzero group so a
    small group never gets scale 0, and 0x00 for an all-zero group; codes of `G / e4m3(σ)`."""
    vmax = C.E2M1_MAX if codebook == "e2m1" else C.E4M3_MAX
    absmax = jnp.abs(groups).max(axis=-1)
    sigma = C.nearest_index(absmax / vmax, C.MAGNITUDES["e4m3"], threshold)
    sigma = jnp.where(absmax > 0, jnp.maximum(sigma, 1), 0).astype(jnp.uint32)
    scale = _nonzero(C.decode(sigma, "e4m3"))
    return C.encode(groups / scale[..., None], codebook, threshold), sigma.astype(jnp.uint8)


@functools.partial(jax.jit, static_argnames=("params", "runtime"))
def quantize_layout(layout: jax.Array, params: QuantParams, runtime: QuantRuntimeConfig):
    """Quantize `layout [..., R, n]` in groups of `params.group_size` along its last axis (one compiled
    program per shape and format, also when called eagerly)."""
    g = params.group_size
    lead, n = layout.shape[:-1], layout.shape[-1]
    groups = layout.astype(jnp.float32).reshape(*lead, n // g, g)
    threshold = runtime.enable_threshold_codebook
    zeros = None
    if params.mode == "affine":
        codes, scales, zeros = _affine(groups, params.bits, runtime.metadata_dtype(layout.dtype))
    elif params.mode == "nf4":
        codes, scales = _nf4(groups, layout.dtype, threshold)
    elif params.mode.startswith("mx"):
        codes, scales = _mx(groups, params.codebook, threshold)
    else:
        codes, scales = _nv(groups, params.codebook, threshold)
    packed = pack_codes(codes.reshape(*lead, n), params.bits)
    return (packed, scales, zeros) if params.mode == "affine" else (packed, scales)


def quantize(w, /, group_size=None, bits=None, mode="affine", axis="row", runtime_config=None):
    """Quantize `w [..., A, B]` in groups of `group_size` consecutive values: packed codes and group metadata.

    `axis="col"` groups along the last axis as given (layout `[..., A, B]`); `axis="row"` first swaps the
    last two axes (layout `[..., B, A]`). In the layout `[..., R, n]` each group is encoded in `mode`, and
    the codes are packed LSB-first into uint32 words along the last axis (`ejkernel.quantization.packing`).
    Statistics are computed in float32 whatever the input dtype, and codes from the metadata as stored
    (after rounding to its dtype), so `dequantize` sees exactly the scales the codes were made for.
    Jittable with every option static.

    The modes (`ejkernel.quantization.modes`): affine codes `clip(round_half_even(G / s + z), 0, 2^b - 1)`
    with `s = (max - min) / (2^b - 1)` (1 for a constant group) and the fractional `z = -min / s`; nf4 the
    NF4 value nearest `G / max|G|`, scale `max|G|`; mxfp4 / mxfp8 the E2M1 / E4M3 code nearest `G · 2^-e`,
    with the shared exponent `e = ceil(log2(max|G| / vmax))` stored as an int8 byte; nvfp4 / nvfp8 the
    E2M1 / E4M3 code nearest `G / e4m3(σ)`, with `σ` the E4M3 code nearest `max|G| / vmax` (0x01 at least
    for a nonzero group). An all-zero group gets scale 1 (exponent 0, `σ` 0x00).

    Args:
        w: `[..., A, B]` float (any float dtype; NumPy accepted), rank >= 2.
        group_size: Values per group, dividing the grouped axis: 16, 32, ..., 1024 for affine and nf4 (None,
            default: 64); 32 for mx and 16 for nv modes (None or that value).
        bits: Code width for affine, 1 to 8; None (default): 4. Ignored by the other modes (4 or 8 bits by
            their format).
        mode: `"affine"` (default), `"nf4"`, `"mxfp4"`, `"mxfp8"`, `"nvfp4"` or `"nvfp8"`, any case.
        axis: `"row"` (default) or `"col"`, as above.
        runtime_config: A `QuantRuntimeConfig` (the dtype of affine metadata, the encoder's strategy); None
            (default): its defaults (float32 metadata).

    Returns:
        tuple: `(w_q, scales, zeros)` for affine, `(w_q, scales)` for the other modes, with `w_q` uint32
        `[..., R, ceil(n · bits / 32)]`; `scales [..., R, n / group_size]`, float32 for affine (by
        default), `w`'s dtype for nf4, uint8 for mx (exponent bytes) and nv (E4M3 codes); affine `zeros`
        shaped and typed like its scales.

    Raises:
        ValueError: `mode`, `group_size`, `bits` or `axis` outside its domain; `w` of rank < 2 or not
            floating-point; a `group_size` that does not divide the grouped axis; a `runtime_config` that
            is not a `QuantRuntimeConfig`.

    Example:
        >>> import numpy as np
        >>> from ejkernel.quantization import quantize
        >>> w = np.random.default_rng(0).standard_normal((128, 64), np.float32)  # [A, B]
        >>> w_q, scales, zeros = quantize(w)  # affine, 4 bits, groups of 64 along A
        >>> print(w_q.shape, w_q.dtype, scales.shape, scales.dtype, zeros.shape)
        (64, 16) uint32 (64, 2) float32 (64, 2)
        >>> w_q, scales = quantize(w, mode="mxfp4", axis="col")  # groups of 32 along B
        >>> print(w_q.shape, scales.shape, scales.dtype)
        (128, 8) (128, 2) uint8
    """
    params = resolve_params(mode, group_size, bits)
    axis = resolve_axis(axis)
    runtime = resolve_runtime(runtime_config)
    w = jnp.asarray(w)
    if w.ndim < 2:
        raise ValueError(f"w must have rank >= 2 ([..., A, B]), got shape {tuple(w.shape)}")
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise ValueError(f"w must be a floating-point array, got dtype {w.dtype}")
    layout = jnp.swapaxes(w, -1, -2) if axis == "row" else w
    if layout.shape[-1] % params.group_size:
        raise ValueError(
            f"w: group_size={params.group_size} must divide the grouped axis of length {layout.shape[-1]} "
            f"(axis={axis!r} groups along dim {w.ndim - 2 if axis == 'row' else w.ndim - 1} of shape {tuple(w.shape)})"
        )
    return quantize_layout(layout, params, runtime)


def prepack_quantized_weights(
    w, /, group_size=None, bits=None, mode="affine", transpose=True, axis=None, runtime_config=None
):
    """Quantize a weight matrix for `ejkernel.modules.quantized_matmul`: `quantize(w, ..., axis=a)`.

    `a` is `axis` if given, else `"row"` if `transpose` else `"col"`. For `kernel [in, out]`, the default
    `transpose=True` packs `W [out, in]` grouped along `in`, the layout of `quantized_matmul` with
    `transpose=True`; `transpose=False` packs `w_q [in, .]` grouped along `out`, the layout of
    `quantized_matmul` with `transpose=False`. Jittable with the options static.

    Args:
        w: `[..., A, B]` float, rank >= 2 (a kernel `[in, out]`).
        group_size: As `quantize`'s; None (default): the mode's default.
        bits: As `quantize`'s; None (default): 4 for affine.
        mode: As `quantize`'s (default `"affine"`).
        transpose: A bool (default True), used when `axis` is None, as above.
        axis: `"row"` or `"col"`, overriding `transpose`; None (default).
        runtime_config: As `quantize`'s; None (default).

    Returns:
        tuple: `quantize`'s result, `(w_q, scales, zeros)` for affine, else `(w_q, scales)`.

    Raises:
        ValueError: A non-bool `transpose` (with `axis` None), and `quantize`'s errors.

    Example:
        >>> import numpy as np
        >>> from ejkernel.quantization import dense_quantized_matmul, prepack_quantized_weights
        >>> kernel = np.random.default_rng(0).standard_normal((64, 128), np.float32)  # [in, out]
        >>> w, scales, zeros = prepack_quantized_weights(kernel)  # W [out, in], groups along in
        >>> print(w.shape, scales.shape)
        (128, 8) (128, 1)
        >>> dense_quantized_matmul(np.ones((2, 64), np.float32), w, scales, zeros, transpose=True).shape
        (2, 128)
        >>> w, scales, zeros = prepack_quantized_weights(kernel, transpose=False)  # [in, out], along out
        >>> print(w.shape, scales.shape)
        (64, 16) (64, 2)
    """
    if axis is None:
        if not isinstance(transpose, bool):
            raise ValueError(f"transpose must be a bool, got {transpose!r}")
        axis = "row" if transpose else "col"
    return quantize(w, group_size, bits, mode, resolve_axis(axis), runtime_config)
