"""Quantized matmul in plain JAX: dequantize a tile of packed rows, multiply it, go on to the next tile.

The packed matrix has rows `R` (K without transpose, N with it) and unpacked columns `C`; a tile is
`tile` packed rows, dequantized to float32 `[tile, C]` and used at once, so the full float matrix never
exists (`fuse=False` makes the tile all of `R`: dequantize, then one matmul). Two products cover the
forward and the backward of both layouts:

- `_times_w(a [M, R]) = a @ W`: a loop over row tiles accumulating `[M, C]` in float32;
- `_times_wt(a [M, C]) = a @ Wᵀ`: one independent `[M, tile]` block of the result per row tile.

Without transpose `y = x @ W` and `∂x = g @ Wᵀ`; with it `y = x @ Wᵀ` and `∂x = g @ W`. Dot operands
are in `x`'s dtype (the dequantized tile rounded to it; a config never changes that), products accumulate
in float32, and the result is float32.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.quantization.decode import decode_layout
from ejkernel.quantization.modes import QuantParams


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything static about one call."""

    params: QuantParams
    transpose: bool
    tile: int  # packed rows per tile
    x_dtype: jnp.dtype  # also the dot operands' dtype


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


def _dot(a, b, plan: _Plan, contract_b: int):
    """`a [M, X]` contracted with `b`'s axis `contract_b`, both in x's dtype, float32 out."""
    op = plan.x_dtype
    return lax.dot_general(
        a.astype(op), b.astype(op), (((1,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32
    )


def _times_w(a, w, scales, zeros, plan: _Plan):
    """`a [M, R] @ W [R, C]`, one row tile of W at a time."""
    rows, tile = w.shape[0], plan.tile
    if tile >= rows:
        return _dot(a, decode_layout(w, scales, zeros, plan.params), plan, 0)
    tiles = _row_tiles(w, scales, zeros, tile)
    count = tiles[0].shape[0]
    a_tiles = jnp.pad(a, [(0, 0), (0, count * tile - rows)]).reshape(a.shape[0], count, tile).swapaxes(0, 1)

    def step(acc, operands):
        a_tile, w_tile, s_tile, z_tile = operands
        return acc + _dot(a_tile, decode_layout(w_tile, s_tile, z_tile, plan.params), plan, 0), None

    columns = scales.shape[1] * plan.params.group_size
    acc, _ = lax.scan(step, jnp.zeros((a.shape[0], columns), jnp.float32), (a_tiles, *tiles))
    return acc


def _times_wt(a, w, scales, zeros, plan: _Plan):
    """`a [M, C] @ W [R, C]ᵀ`, one `[M, tile]` block of the result per row tile of W."""
    rows, tile = w.shape[0], plan.tile
    if tile >= rows:
        return _dot(a, decode_layout(w, scales, zeros, plan.params), plan, 1)
    tiles = _row_tiles(w, scales, zeros, tile)
    blocks = lax.map(lambda t: _dot(a, decode_layout(*t, plan.params), plan, 1), tiles)  # [T, M, tile]
    return blocks.swapaxes(0, 1).reshape(a.shape[0], -1)[:, :rows]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _quantized_matmul(x, w, scales, zeros, plan: _Plan):
    return (_times_wt if plan.transpose else _times_w)(x, w, scales, zeros, plan)


def _forward(x, w, scales, zeros, plan: _Plan):
    return _quantized_matmul(x, w, scales, zeros, plan), (w, scales, zeros)


def _backward(plan: _Plan, residuals, g):
    """`∂x` in x's dtype; the packed weights and their metadata get zero cotangents (None)."""
    w, scales, zeros = residuals
    dx = (_times_w if plan.transpose else _times_wt)(g, w, scales, zeros, plan)
    return dx.astype(plan.x_dtype), None, None, None


_quantized_matmul.defvjp(_forward, _backward)


@functools.partial(jax.jit, static_argnames=("cfg", "transpose", "group_size", "bits", "mode", "fuse"))
def quantized_matmul_xla(
    x, w, scales, zeros=None, *, cfg, transpose: bool, group_size: int, bits: int, mode: str, fuse: bool
):
    """float32 `[M, N]`: `x [M, K]` times the packed weights (checked by the public function).

    Tiles are `cfg.block_k` packed rows without transpose (rows of W are K) and `cfg.block_n` with it
    (rows are N); `fuse=False` dequantizes all rows at once. Neither changes the result beyond float32
    summation order. Differentiable in `x` (custom VJP, `∂x` in x's dtype).
    """
    rows = w.shape[0]
    block = cfg.block_n if transpose else cfg.block_k
    tile = max(1, rows if not fuse else min(block, rows))
    plan = _Plan(
        QuantParams(mode, group_size, bits),
        transpose,
        tile,
        jnp.dtype(x.dtype),
    )
    return _quantized_matmul(x, w, scales, zeros, plan)
