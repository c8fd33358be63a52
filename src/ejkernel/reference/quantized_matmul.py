"""Reference quantized matmul: read each row's bit stream, decode every code, scale each group, then one
float32 matmul. Written from the format's definition alone (no code shared with `ejkernel.quantization`)."""

import jax.numpy as jnp
import numpy as np
from jax import lax

NF4_VALUES = np.array(
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

_DEFAULT_GROUP = {"affine": 64, "nf4": 64, "mxfp4": 32, "mxfp8": 32, "nvfp4": 16, "nvfp8": 16}
_BITS = {"nf4": 4, "mxfp4": 4, "mxfp8": 8, "nvfp4": 4, "nvfp8": 8}


def unpack_reference(words, bits: int, n: int) -> np.ndarray:
    """int64 codes `[rows, n]`: row `r`'s words as one little-endian bit stream, code `i` = bits `[i*b, (i+1)*b)`."""
    words = np.ascontiguousarray(np.asarray(words, np.uint32).astype("<u4"))
    stream = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")  # bit j of word w at 32*w + j
    code_bits = stream[:, : n * bits].reshape(words.shape[0], n, bits).astype(np.int64)
    return code_bits @ (1 << np.arange(bits, dtype=np.int64))


def e2m1_value(code: np.ndarray) -> np.ndarray:
    """FP4 E2M1: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0."""
    sign = np.where(code & 8, -1.0, 1.0)
    exponent, mantissa = (code >> 1) & 3, code & 1
    magnitude = np.where(exponent == 0, mantissa * 0.5, (1 + mantissa / 2) * np.exp2(exponent - 1.0))
    return sign * magnitude


def e4m3_value(code: np.ndarray) -> np.ndarray:
    """FP8 E4M3 (FN): sign bit 7, exponent bits 6-3 (bias 7), mantissa bits 2-0; 0x7F and 0xFF are NaN."""
    sign = np.where(code & 0x80, -1.0, 1.0)
    exponent, mantissa = (code >> 3) & 15, code & 7
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * np.exp2(exponent - 7.0))
    return np.where(code & 0x7F == 0x7F, np.nan, sign * magnitude)


def dequantize_reference(w, scales, zeros=None, *, group_size: int, bits: int, mode: str) -> np.ndarray:
    """float32 `[rows, n_groups * group_size]` from packed `w [rows, words]` and per-group `scales`/`zeros`."""
    scales = np.asarray(scales)
    num_groups = scales.shape[1]
    q = unpack_reference(w, bits, num_groups * group_size)
    per_value = lambda meta: np.repeat(np.asarray(meta), group_size, axis=1)  # group metadata for each value
    if mode == "affine":
        s, z = per_value(scales).astype(np.float32), per_value(zeros).astype(np.float32)
        return (q.astype(np.float32) - z) * s
    if mode == "nf4":
        return NF4_VALUES[q] * per_value(scales).astype(np.float32)
    value = e2m1_value(q) if bits == 4 else e4m3_value(q)
    if mode.startswith("mx"):
        exponent = per_value(scales).astype(np.uint8).view(np.int8).astype(np.int64)  # two's-complement byte
        return np.ldexp(value, exponent).astype(np.float32)
    return (value * e4m3_value(per_value(scales).astype(np.int64))).astype(np.float32)


def quantized_matmul_reference(
    x, w, scales, zeros=None, *, transpose: bool = False, group_size=None, bits=None, mode: str = "affine"
):
    """float32 `x [..., K] @ W` (`@ Wᵀ` when `transpose`), `W` the dequantized `w` (concrete arrays).

    Layout: without transpose `w` packs `W [K, N]` grouped along N; with it, `W [N, K]` grouped along K.
    Differentiable in `x` (plain autodiff).
    """
    mode = mode.lower()
    group_size = _DEFAULT_GROUP[mode] if group_size is None else group_size
    bits = _BITS.get(mode, 4 if bits is None else bits)
    weights = jnp.asarray(dequantize_reference(w, scales, zeros, group_size=group_size, bits=bits, mode=mode))
    rhs = weights.T if transpose else weights
    return jnp.matmul(jnp.asarray(x, jnp.float32), rhs, precision=lax.Precision.HIGHEST)
