"""Quantized weights of a grouped matmul: how the kernels receive them, their checks, and the frozen-weights VJP.

Two forms reach an implementation's products in place of a float `rhs`:

- `PackedGroupWeights`: a `QuantizedArray` (`ejkernel.quantization`) with a leading group axis, codes
  `[L, R, words]` and group metadata `[L, R, C/g]` packing `L` matrices `[R, C]`. Its `axis` and the call's
  `transpose_rhs` say which of R and C is K: `quantize_array(w, axis="col")` packs `w`'s last two axes as they
  are, `axis="row"` swapped, and `w` itself is `[L, K, N]` (`[L, N, K]` with `transpose_rhs`), so the packed
  rows are N exactly when `(axis == "row") != transpose_rhs`, which is then the products' `transpose_rhs` (the
  packed matrix is read as a float `rhs [L, R, C]` would be). The weights are frozen: only `∂lhs` is computed
  (`frozen_vjp`); the codes and metadata get zero cotangents.
- `ScaledGroupWeights`: upstream's v3 `rhs` (int8, float8_e4m3fn, or any float) with `rhs_scale [L, blocks, 1, N]`
  multiplying each of `blocks` equal K blocks of each column (DeepSeek's 128 x 128 FP8 block scales broadcast
  along N). Differentiable as the v3 contract says: `∂rhs` (float rhs) and `∂rhs_scale` from the dense weight
  gradient.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ejkernel.kernels._common.scaled_codes import code_values, quantize_rows
from ejkernel.quantization.array import QuantizedArray
from ejkernel.quantization.decode import check_packed, decode_layout
from ejkernel.quantization.modes import QuantParams, resolve_axis, resolve_params


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedGroupWeights:
    """`L` packed matrices `[R, C]`: codes `data [L, R, words]`, `scales [L, R, C/g]`, affine `zeros`."""

    data: jax.Array
    scales: jax.Array
    zeros: jax.Array | None
    params: QuantParams = dataclasses.field(metadata={"static": True})

    @property
    def shape(self) -> tuple[int, int, int]:
        """`(L, R, C)`: the shape of the float `rhs` these weights stand for, as stored."""
        return (*self.data.shape[:2], self.scales.shape[2] * self.params.group_size)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScaledGroupWeights:
    """v3 weights: `data [L, K, N]` (`[L, N, K]` when not `k_first`) and `scale [L, blocks, 1, N]`."""

    data: jax.Array
    scale: jax.Array
    k_first: bool = dataclasses.field(metadata={"static": True})

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def block(self) -> int:
        """K rows per scale block."""
        k = self.data.shape[1] if self.k_first else self.data.shape[2]
        return k // self.scale.shape[1]


def is_quantized(rhs) -> bool:
    """Whether `rhs` is a `QuantizedArray` (packed codes) rather than an array."""
    return isinstance(rhs, QuantizedArray)


def rows_are_n(rhs: QuantizedArray, transpose_rhs: bool) -> bool:
    """Whether the packed rows of `rhs` are the output columns N (see the module's docstring)."""
    return (rhs.axis == "row") != bool(transpose_rhs)


def check_quantized_rhs(rhs: QuantizedArray, k: int, transpose_rhs: bool) -> tuple[int, int]:
    """`(L, N)` of a `QuantizedArray` rhs for `lhs [M, k]`, after checking its format and shapes (ValueError)."""
    try:
        params = resolve_params(rhs.mode, rhs.group_size, rhs.bits)
        resolve_axis(rhs.axis)
    except ValueError as error:
        raise ValueError(f"rhs (a QuantizedArray): {error}") from None
    data, scales = rhs.data, rhs.scales
    if getattr(data, "ndim", None) != 3:
        raise ValueError(
            f"rhs (a QuantizedArray) must carry a leading group axis: data [L, R, words], got shape "
            f"{getattr(data, 'shape', None)} (quantize_array(w) of w [L, K, N] or [L, N, K])"
        )
    check_packed(data, scales, rhs.zeros, params, names=("rhs.data", "rhs.scales", "rhs.zeros"))
    rows, columns = data.shape[1], scales.shape[2] * params.group_size
    by_n = rows_are_n(rhs, transpose_rhs)
    rhs_k, n = (columns, rows) if by_n else (rows, columns)
    if by_n and k % params.group_size:
        raise ValueError(
            f"rhs (a QuantizedArray grouped along K): group_size {params.group_size} must divide K = lhs.shape[1] = {k}"
        )
    if rhs_k != k:
        raise ValueError(
            f"rhs (a QuantizedArray, axis={rhs.axis!r}, transpose_rhs={bool(transpose_rhs)}) holds K = {rhs_k},"
            f" must equal lhs.shape[1] = {k}"
        )
    return data.shape[0], n


def packed_weights(rhs: QuantizedArray) -> PackedGroupWeights:
    """The checked `QuantizedArray`'s arrays and resolved format as the products take them."""
    return PackedGroupWeights(rhs.data, rhs.scales, rhs.zeros, resolve_params(rhs.mode, rhs.group_size, rhs.bits))


def group_weights(rhs, group, dtype) -> jax.Array:
    """One group's `[R, C]` matrix in `dtype`: of a float `rhs [L, R, C]`, or decoded from packed weights."""
    if not isinstance(rhs, PackedGroupWeights):
        return lax.dynamic_index_in_dim(rhs, group, keepdims=False).astype(dtype)
    pick = lambda a: None if a is None else lax.dynamic_index_in_dim(a, group, keepdims=False)
    return decode_layout(pick(rhs.data), pick(rhs.scales), pick(rhs.zeros), rhs.params).astype(dtype)


def dense_weights(rhs: PackedGroupWeights, dtype) -> jax.Array:
    """All `[L, R, C]` matrices decoded in `dtype`, with no derivative (the weights are frozen)."""
    return lax.stop_gradient(decode_layout(rhs.data, rhs.scales, rhs.zeros, rhs.params).astype(dtype))


def scaled_cotangent(weights: ScaledGroupWeights, dense: jax.Array) -> ScaledGroupWeights:
    """Cotangents of v3 weights from the gradient `dense` of the scaled matrices (float32, laid out as `data`):
    `∂scale[l, b, 0, n] = Σ_k∈b dense·data` and `∂data = dense·scale` (float0 zeros for integer data)."""
    to_kn = (lambda a: a) if weights.k_first else (lambda a: jnp.swapaxes(a, 1, 2))  # its own inverse
    dense_kn, data_kn = to_kn(dense), to_kn(weights.data).astype(jnp.float32)
    num_local, k, n = dense_kn.shape
    blocks = weights.scale.shape[1]
    d_scale = (dense_kn * data_kn).reshape(num_local, blocks, k // blocks, n).sum(axis=2)[:, :, None, :]
    if jnp.issubdtype(weights.data.dtype, jnp.floating):
        scale = jnp.repeat(weights.scale[:, :, 0, :].astype(jnp.float32), k // blocks, axis=1)
        d_data = to_kn(dense_kn * scale).astype(weights.data.dtype)
    else:
        d_data = np.zeros(weights.data.shape, jax.dtypes.float0)
    return ScaledGroupWeights(d_data, d_scale.astype(weights.scale.dtype), weights.k_first)


def check_fp8_lhs(fp8_lhs, rhs, rhs_scale) -> None:
    """`fp8_lhs` must be a bool, and True only with a float8_e4m3fn array rhs and `rhs_scale` (ValueError)."""
    if not isinstance(fp8_lhs, bool):
        raise ValueError(f"fp8_lhs must be a bool, got {fp8_lhs!r}")
    dtype = None if is_quantized(rhs) else jnp.dtype(rhs.dtype)
    if fp8_lhs and (dtype != jnp.float8_e4m3fn or rhs_scale is None):
        given = "a QuantizedArray" if dtype is None else dtype
        raise ValueError(
            f"fp8_lhs multiplies FP8 by FP8: it needs a float8_e4m3fn rhs with rhs_scale (use_v3=True), got rhs "
            f"{given} and rhs_scale {None if rhs_scale is None else tuple(rhs_scale.shape)}"
        )


def fp8_row_blocks(lhs, block: int) -> tuple[jax.Array, jax.Array]:
    """`(codes [M, K] float8_e4m3fn, scales [M, K / block] float32)`: each row's blocks of `block` K values
    quantised as rows of their own (`quantize_rows`), the FP8 x FP8 product's lhs."""
    m, k = lhs.shape
    codes, scales = quantize_rows(lhs.reshape(m, k // block, block), jnp.float8_e4m3fn)
    return codes.reshape(m, k), scales


def fp8_rows(lhs, block: int) -> jax.Array:
    """`lhs [M, K]` through FP8 as the FP8 x FP8 product sees it (`fp8_row_blocks`, multiplied back), in lhs's
    dtype. Its gradient is the identity (straight through the rounding)."""
    m, k = lhs.shape
    codes, scale = fp8_row_blocks(lhs, block)
    values = code_values(codes).reshape(m, k // block, block) * scale[..., None]
    return lhs + lax.stop_gradient(values.reshape(m, k).astype(lhs.dtype) - lhs)


def frozen_vjp(gmm, tgmm):
    """The differentiable core `(st, lhs_dtype, lhs, weights, group_sizes, group_offset) -> out [M, N]` over
    `PackedGroupWeights` or `ScaledGroupWeights` (products as `grouped_matmul.grouped_vjp` takes them).

    `∂lhs = gmm(dout, weights)` with the other transpose: the same kernel, decoding the same tiles. Packed
    weights are frozen (zero cotangents, and nothing kept for them); v3 weights get `scaled_cotangent` of
    `tgmm`'s dense gradient.
    """

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
    def core(st, lhs_dtype, lhs, weights, group_sizes, group_offset):
        return gmm(
            lhs,
            weights,
            group_sizes,
            group_offset,
            transpose_rhs=st.transpose_rhs,
            out_dtype=st.out_dtype,
            tiling=st.fwd,
        )

    def core_fwd(st, lhs_dtype, lhs, weights, group_sizes, group_offset):
        kept = lhs if isinstance(weights, ScaledGroupWeights) else None
        return core(st, lhs_dtype, lhs, weights, group_sizes, group_offset), (kept, weights, group_sizes, group_offset)

    def core_bwd(st, lhs_dtype, residuals, dout):
        lhs, weights, group_sizes, group_offset = residuals
        dout = dout.astype(lhs_dtype)
        dlhs = gmm(
            dout,
            weights,
            group_sizes,
            group_offset,
            transpose_rhs=not st.transpose_rhs,
            out_dtype=lhs_dtype,
            tiling=st.dlhs,
        )
        if lhs is None:
            return dlhs, None, None, None
        x, y = (dout, lhs) if st.transpose_rhs else (lhs, dout)
        dense = tgmm(x, y, group_sizes, group_offset, num_local=st.num_local, out_dtype=jnp.float32, tiling=st.drhs)
        return dlhs, scaled_cotangent(weights, dense), None, None

    core.defvjp(core_fwd, core_bwd)
    return core
