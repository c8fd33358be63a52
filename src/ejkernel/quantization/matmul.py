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
    """`x [..., K]` times the dequantized weights (`Wᵀ` when transposed), the plain way.

    Dequantizes all of `W` in float32 and multiplies once, with x cast to float32;
    `ejkernel.modules.quantized_matmul` is the op with tiled implementations and a custom VJP (its products
    take x's dtype). Layouts: with `transpose=False`, `w [K, ceil(N·b/32)]` and `scales [K, N/g]` pack
    `W [K, N]` and `y = x @ W`; with `transpose=True`, `w [N, ceil(K·b/32)]` and `scales [N, K/g]` pack
    `W [N, K]` and `y = x @ Wᵀ`. Differentiable by plain autodiff.

    Args:
        x: `[..., K]` float, rank >= 2.
        w: uint32 packed codes, 2-D, in the layout above.
        scales: 2-D group metadata: float for affine and nf4, uint8 for mx and nv modes.
        zeros: Affine zero points, float, shaped like `scales`; None (default) for the other modes.
        transpose: Which layout `w` has (default False).
        group_size: As given to `quantize`; None (default): the mode's default.
        bits: As given to `quantize`; None (default): 4 for affine.
        mode: As given to `quantize` (default `"affine"`).
        axis: `"row"` (`transpose=False`) or `"col"` (`transpose=True`), winning over `transpose`; None
            (default).

    Returns:
        `y [..., N]`, float32.

    Raises:
        ValueError: `mode`, `group_size`, `bits`, `axis` or `transpose` outside its domain; x, `w`,
            `scales` or `zeros` of a wrong dtype, rank or shape.

    Example:
        >>> import numpy as np
        >>> from ejkernel.quantization import dense_quantized_matmul, quantize
        >>> w = np.tile(np.arange(16, dtype=np.float32), (32, 4))  # W [K=32, N=64], exact in 4 bits
        >>> x = np.ones((3, 32), np.float32)
        >>> y = dense_quantized_matmul(x, *quantize(w, axis="col"))
        >>> print(y.shape, y.dtype, bool((y == x @ w).all()))
        (3, 64) float32 True
    """
    params = resolve_params(mode, group_size, bits)
    transpose = resolve_transpose(transpose, axis)
    x, w, scales = jnp.asarray(x), jnp.asarray(w), jnp.asarray(scales)
    zeros = None if zeros is None else jnp.asarray(zeros)
    check_matmul_operands(x, w, scales, zeros, params, transpose)
    weights = decode_layout(w, scales, zeros, params)
    return jnp.matmul(x.astype(jnp.float32), weights.T if transpose else weights)
