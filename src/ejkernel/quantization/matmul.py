"""The packed-weight layout of a quantized matmul, its checks, and the dense dequantize-then-matmul.

- `transpose=False`: `w` packs `W [K, N]` grouped along N: `w [K, ceil(N*b/32)]`, `scales [K, N/g]`,
  `y = x @ W`.
- `transpose=True`: `w` packs `W [N, K]` grouped along K: `w [N, ceil(K*b/32)]`, `scales [N, K/g]`,
  `y = x @ Wᵀ`.

`axis="row"` means `transpose=False` and `axis="col"` means `transpose=True`; a given `axis` wins.
"""

import jax
import jax.numpy as jnp

from ejkernel.quantization.decode import check_packed, decode_layout
from ejkernel.quantization.modes import QuantParams, resolve_axis, resolve_params


def resolve_transpose(transpose, axis) -> bool:
    """The layout flag: from `axis` when given (`"col"` is transposed), else `transpose`."""
    if axis is not None:
        return resolve_axis(axis) == "col"
    if not isinstance(transpose, bool):
        raise ValueError(f"transpose must be a bool, got {transpose!r}")
    return transpose


def check_matmul_operands(x, w, scales, zeros, params: QuantParams, transpose: bool) -> tuple[int, int]:
    """`(K, N)` of a quantized matmul of `x [..., K]`, after checking every dtype and shape (`ValueError`)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"x must be a floating-point array, got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"x must be [M, K] (or [..., M, K]), got shape {tuple(x.shape)}")
    for name, a in (("w", w), ("scales", scales), ("zeros", zeros)):
        if a is not None and a.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(a.shape)}")
    check_packed(w, scales, zeros, params, names=("w", "scales", "zeros"))
    k = x.shape[-1]
    grouped = scales.shape[1] * params.group_size  # the unpacked length of each packed row
    if transpose:
        if grouped != k:
            raise ValueError(
                f"scales {tuple(scales.shape)} must be [N, K/g] with K = x.shape[-1] = {k} and g = "
                f"{params.group_size} (transpose=True)"
            )
        return k, w.shape[0]
    if w.shape[0] != k:
        raise ValueError(f"w must be [K, words] with K = x.shape[-1] = {k} (transpose=False), got {tuple(w.shape)}")
    return k, grouped


def dense_quantized_matmul(
    x, w, /, scales, zeros=None, *, transpose=False, group_size=None, bits=None, mode="affine", axis=None
) -> jax.Array:
    """`x [..., K]` times the dequantized weights (`Wᵀ` when transposed): float32 `[..., N]`.

    The plain path, dequantize all of `W` in float32 and multiply once; `ejkernel.modules.quantized_matmul`
    is the op with tiled implementations and a custom VJP. Differentiable by plain autodiff.
    """
    params = resolve_params(mode, group_size, bits)
    transpose = resolve_transpose(transpose, axis)
    x, w, scales = jnp.asarray(x), jnp.asarray(w), jnp.asarray(scales)
    zeros = None if zeros is None else jnp.asarray(zeros)
    check_matmul_operands(x, w, scales, zeros, params, transpose)
    weights = decode_layout(w, scales, zeros, params)
    return jnp.matmul(x.astype(jnp.float32), weights.T if transpose else weights)
