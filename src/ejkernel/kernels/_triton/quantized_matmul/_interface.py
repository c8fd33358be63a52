"""The Pallas-Triton quantized matmul for decoding: few rows of x times packed weights, read once.

Serves the weight-only decode case (at most `DECODE_ROWS` rows of x) for code widths dividing a word into
power-of-two counts (4 and 8 bits: affine int4/int8, nf4, mxfp4/8, nvfp4/8), in both layouts, and declines
the rest (NotImplementedError, so `platform="auto"` falls back to XLA): more rows (a matmul bound by
compute, where dequantizing tiles for XLA's matmul is the better plan), other widths, empty operands,
x in float64. The backward (`∂x` only: the weights are frozen) is the plain-JAX product of `_common`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common.device import num_sms
from ejkernel.kernels._common.quantized_matmul import (
    DECODE_BITS,
    DECODE_ROWS,
    QuantizedMatmulStatic,
    default_tile,
    with_vjp,
)
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.quantized_matmul._kernel import TritonQuantizedMatmulTiling, matmul, nibble_phases
from ejkernel.quantization.modes import QuantParams

WHO = "triton quantized_matmul"
SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MIN_BLOCK = 16  # the smallest tile edge of a Triton dot
MAX_TILE_VALUES = 1 << 15  # decoded values of one step's tile (held in registers: 128 a thread at 8 warps)
MAX_BLOCK_K = 512
MAX_BLOCK_N = 256


def _fit(block: int, size: int, largest: int) -> int:
    """A power-of-two tile edge at least `MIN_BLOCK`, at most `largest` and no larger than `size` needs."""
    return max(MIN_BLOCK, min(block, largest, pl.next_power_of_2(max(size, 1))))


def tiling(cfg, m: int, k: int, n: int, bits: int, interpret: bool, phases: int = 1) -> TritonQuantizedMatmulTiling:
    """The kernel's tiles from `cfg` (`block_m`, `block_n`, `block_k`, `split_k`, `num_warps`, `num_stages`),
    fitted to the problem: a step decodes at most `MAX_TILE_VALUES` values (the contraction tile shrinks).
    Without `split_k` the contraction is split until the programs fill one wave of the GPU's SMs, as far as
    the float32 partial sums (written, then read back: 8·M bytes a column and split) stay under an eighth of
    the packed weights' bytes (K·bits/8 a column)."""
    block_m = _fit(cfg.block_m, m, DECODE_ROWS)
    block_n = _fit(cfg.block_n, n, MAX_BLOCK_N)
    block_k = _fit(cfg.block_k, k, MAX_BLOCK_K)
    block_k = max(MIN_BLOCK, min(block_k, MAX_TILE_VALUES // block_n))
    block_k = max(block_k, phases * MIN_BLOCK)  # each nibble phase's half of the step is still a dot's edge
    steps = pl.cdiv(k, block_k)
    if cfg.split_k is not None:
        splits = min(cfg.split_k, steps)
    else:
        programs = pl.cdiv(n, block_n) * pl.cdiv(m, block_m)
        sms = num_sms()
        affordable = k * bits // (8 * 8 * 8 * m)
        splits = max(1, min(sms // programs, steps // 4, affordable))  # each split walks at least 4 steps
    return TritonQuantizedMatmulTiling(block_m, block_n, block_k, splits, cfg.num_warps, cfg.num_stages, interpret)


def _decline(x, params: QuantParams, n: int) -> None:
    """NotImplementedError for the calls this kernel does not serve (see the module's docstring)."""
    if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
        raise NotImplementedError(f"{WHO} takes float32/bfloat16/float16 x, got {x.dtype}")
    if params.bits not in DECODE_BITS:
        raise NotImplementedError(f"{WHO} takes codes of {DECODE_BITS} bits, got {params.bits} ({params.mode})")
    if x.shape[0] > DECODE_ROWS:
        raise NotImplementedError(f"{WHO} serves up to {DECODE_ROWS} rows of x (decoding), got {x.shape[0]}")
    if min(x.shape[0], x.shape[1], n) == 0:
        raise NotImplementedError(f"{WHO} needs non-empty operands, got x {tuple(x.shape)} and N = {n}")


@functools.partial(jax.jit, static_argnames=("static", "tiling"))
def _run(x, w, scales, zeros, *, static: QuantizedMatmulStatic, tiling: TritonQuantizedMatmulTiling):
    forward = functools.partial(matmul, params=static.params, transpose=static.transpose, tiling=tiling)
    return with_vjp(forward, x, w, scales, zeros, static)


def quantized_matmul_triton(
    x, w, scales, zeros=None, *, cfg, transpose: bool, group_size: int, bits: int, mode: str, fuse: bool, interpret=None
):
    """float32 `[M, N]`: `x [M, K]` (M at most `DECODE_ROWS`) times the packed weights (checked by the public
    function), in one Triton kernel (`_kernel`); `fuse` changes nothing here (the kernel never dequantizes W
    whole). Tiles from `cfg` as `tiling` says; none changes the result beyond float32 summation order.
    Differentiable in `x` (`∂x` in x's dtype, from the plain-JAX product). `interpret=None` compiles for the
    GPU (off a GPU that is an error: ask for `interpret=True`).
    """
    del fuse
    params = QuantParams(mode, group_size, bits)
    k, columns = x.shape[1], scales.shape[1] * group_size
    n = w.shape[0] if transpose else columns
    _decline(x, params, n)
    interpret = resolve_interpret(interpret, WHO)
    static = QuantizedMatmulStatic(params, transpose, default_tile(w.shape[0], columns), jnp.dtype(x.dtype))
    phases = nibble_phases(params, transpose, k)
    return _run(x, w, scales, zeros, static=static, tiling=tiling(cfg, x.shape[0], k, n, bits, interpret, phases))
