"""Quantized matmul in plain JAX: dequantize a tile of packed rows, multiply it, go on to the next tile.

The products and the backward are `_common.quantized_matmul`'s (shared with the GPU kernel, whose
backward they are); here they run the forward too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.quantized_matmul import QuantizedMatmulStatic, product, with_vjp
from ejkernel.quantization.modes import QuantParams


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
    static = QuantizedMatmulStatic(QuantParams(mode, group_size, bits), transpose, tile, jnp.dtype(x.dtype))
    return with_vjp(functools.partial(product, static=static), x, w, scales, zeros, static)
