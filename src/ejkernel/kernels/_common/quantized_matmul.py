"""What every quantized matmul implementation shares: the plain-JAX tiled products and the backward.

The packed matrix has rows `R` (K without transpose, N with it) and unpacked columns `C`; a tile is
`tile` packed rows, dequantized to float32 `[tile, C]` and used at once, so the full float matrix never
exists (a tile of all `R` rows: dequantize, then one matmul). Two products cover the forward and the
backward of both layouts:

- `times_w(a [M, R]) = a @ W`: a loop over row tiles accumulating `[M, C]` in float32;
- `times_wt(a [M, C]) = a @ Wᵀ`: one independent `[M, tile]` block of the result per row tile.

Without transpose `y = x @ W` and `∂x = g @ Wᵀ`; with it `y = x @ Wᵀ` and `∂x = g @ W`. Dot operands
are in `x`'s dtype (the dequantized tile rounded to it), products accumulate in float32, and the result is
float32. The XLA implementation is these products; a GPU kernel replaces the forward and keeps the backward
(`with_vjp`): the op serves frozen weights, so only `∂x` is needed, and it is the same product transposed.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.quantization.decode import decode_layout
from ejkernel.quantization.modes import QuantParams

TILE_VALUES = 1 << 22
"""Dequantized values per row tile of the products when the caller names none (16 MiB of float32)."""
DECODE_ROWS = 64
"""The most rows of x the GPU decode kernel serves; more rows make the product bound by compute, where XLA's
tiled matmul serves them."""
DECODE_BITS = (4, 8)
"""The code widths the GPU decode kernel unpacks (a word holds a power-of-two count of codes)."""


@dataclasses.dataclass(frozen=True)
class QuantizedMatmulStatic:
    """Everything static about one call: the format, the layout, packed rows per tile, x's dtype."""

    params: QuantParams
    transpose: bool
    tile: int
    x_dtype: jnp.dtype  # also the dot operands' dtype


def default_tile(rows: int, columns: int) -> int:
    """Packed rows per tile holding about `TILE_VALUES` dequantized values (a power of two, at least 8)."""
    return max(8, min(1 << max(0, (TILE_VALUES // max(columns, 1)).bit_length() - 1), max(rows, 1)))


def _row_tiles(w, scales, zeros, tile: int):
    """`(w, scales, zeros)` with rows padded to a multiple of `tile` and split into `[T, tile, ...]` tiles.

    Padded rows hold zero words and zero metadata: every mode decodes them to finite values (0).
    """
    rows = w.shape[0]
    count = -(-rows // tile)

    def split(a):
        if a is None:
            return None
        a = jnp.pad(a, [(0, count * tile - rows), (0, 0)])
        return a.reshape(count, tile, a.shape[-1])

    return split(w), split(scales), split(zeros)


def _dot(a, b, static: QuantizedMatmulStatic, contract_b: int):
    """`a [M, X]` contracted with `b`'s axis `contract_b`, both in x's dtype, float32 out."""
    op = static.x_dtype
    return lax.dot_general(
        a.astype(op), b.astype(op), (((1,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32
    )


def times_w(a, w, scales, zeros, static: QuantizedMatmulStatic):
    """`a [M, R] @ W [R, C]`, one row tile of W at a time."""
    rows, tile = w.shape[0], static.tile
    if tile >= rows:
        return _dot(a, decode_layout(w, scales, zeros, static.params), static, 0)
    tiles = _row_tiles(w, scales, zeros, tile)
    count = tiles[0].shape[0]
    a_tiles = jnp.pad(a, [(0, 0), (0, count * tile - rows)]).reshape(a.shape[0], count, tile).swapaxes(0, 1)

    def step(acc, operands):
        a_tile, w_tile, s_tile, z_tile = operands
        return acc + _dot(a_tile, decode_layout(w_tile, s_tile, z_tile, static.params), static, 0), None

    columns = scales.shape[1] * static.params.group_size
    acc, _ = lax.scan(step, jnp.zeros((a.shape[0], columns), jnp.float32), (a_tiles, *tiles))
    return acc


def times_wt(a, w, scales, zeros, static: QuantizedMatmulStatic):
    """`a [M, C] @ W [R, C]ᵀ`, one `[M, tile]` block of the result per row tile of W."""
    rows, tile = w.shape[0], static.tile
    if tile >= rows:
        return _dot(a, decode_layout(w, scales, zeros, static.params), static, 1)
    tiles = _row_tiles(w, scales, zeros, tile)
    blocks = lax.map(lambda t: _dot(a, decode_layout(*t, static.params), static, 1), tiles)  # [T, M, tile]
    return blocks.swapaxes(0, 1).reshape(a.shape[0], -1)[:, :rows]


def product(x, w, scales, zeros, static: QuantizedMatmulStatic):
    """The forward, `y = x @ W` (`x @ Wᵀ` with transpose), float32, in plain JAX."""
    return (times_wt if static.transpose else times_w)(x, w, scales, zeros, static)


def with_vjp(forward, x, w, scales, zeros, static: QuantizedMatmulStatic):
    """`forward(x, w, scales, zeros)` differentiable in `x`: `∂x` (in x's dtype) is the transposed product in
    plain JAX; the packed weights and their metadata get zero cotangents."""

    @jax.custom_vjp
    def matmul(x, w, scales, zeros):
        return forward(x, w, scales, zeros)

    def fwd(x, w, scales, zeros):
        return matmul(x, w, scales, zeros), (w, scales, zeros)

    def bwd(residuals, g):
        w, scales, zeros = residuals
        dx = (times_w if static.transpose else times_wt)(g, w, scales, zeros, static)
        return dx.astype(static.x_dtype), None, None, None

    matmul.defvjp(fwd, bwd)
    return matmul(x, w, scales, zeros)
