"""Grouped matmul through Pallas-Triton kernels: the public-contract entry point and its tilings.

The forward is `_kernel.gmm` over the tile schedule; the backward is `gmm` again with the other
transpose (dlhs) and `_kernel.tgmm` (drhs), wired by `_common.grouped_matmul.grouped_vjp`; v3 scales
and biases, `existing_out` and the checks are the shared wrapping of `_common.grouped_matmul.implementation`.
Quantized weights (a `QuantizedArray` of 4- or 8-bit codes; v3 int8 / FP8 with block scales) are decoded in
the kernel, tile by tile (`_kernel`'s docstring); the lhs gradient is the same kernel transposed.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common.grouped_matmul import implementation, tile_params
from ejkernel.kernels._common.grouped_matmul_quantized import PackedGroupWeights, ScaledGroupWeights
from ejkernel.kernels._common.quantized_matmul import DECODE_BITS
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.grouped_matmul._kernel import TritonGroupedMatmulTiling, gmm, tgmm

MIN_BLOCK = 16  # smallest tile edge the Triton matmuls take
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))  # of lhs, the kernels take
# (block_m, block_k, block_n, num_warps, num_stages) of the forward and of both backward products.
DEFAULT_FWD = (128, 64, 256, 8, 3)
DEFAULT_BWD = (128, 64, 128, 8, 3)
# The forward decoding quantized weights: on an H200 at M 32768, K 4096, N 1536, 64 groups, against DEFAULT_FWD's
# 2.56 / 2.22 / 1.48 ms: MXFP4 1.78, int4 (groups of 128) 1.75, FP8 with 128 x 128 block scales 1.31
# (exp/s36_qgmm.py; the transposed tile, decoded weights as the register operand, was slower in every case). Not
# for the FP8 x FP8 forward (`fp8_lhs`): 4.66 ms at these tiles against 4.05 at DEFAULT_FWD's.
DEFAULT_QUANTIZED_FWD = (128, 64, 128, 4, 3)
WHO = "triton grouped_matmul"
MAX_FP8_STEP = 256  # the largest scale block the FP8 x FP8 forward takes as one K step


def _fit(block: int, size: int) -> int:
    """A small dimension gets a smaller (power-of-two) tile rather than mostly padding; none below `MIN_BLOCK`."""
    return max(MIN_BLOCK, min(block, pl.next_power_of_2(size)))


def tiling(params, default, rows: int, contraction: int, cols: int, interpret: bool) -> TritonGroupedMatmulTiling:
    """A product's `TritonGroupedMatmulTiling` from config params (None fields: `default`), fitted to its sizes."""
    fields = ("block_q", "block_k", "block_d", "num_warps", "num_stages")
    given = [None if params is None else getattr(params, f) for f in fields]
    bm, bk, bn, warps, stages = (d if g is None else g for g, d in zip(given, default, strict=True))
    return TritonGroupedMatmulTiling(_fit(bm, rows), _fit(bk, contraction), _fit(bn, cols), warps, stages, interpret)


def _tilings(dims, lhs, *, cfg, interpret, precision, transpose_rhs, quantized):
    """(output rows, contraction, output columns) tiles of the forward, dlhs and drhs products; the forward's
    default is `DEFAULT_QUANTIZED_FWD` where it decodes weights."""
    if jnp.dtype(lhs.dtype) not in DTYPES:
        raise NotImplementedError(f"{WHO} takes float32/bfloat16/float16, got {lhs.dtype}")
    interpret = resolve_interpret(interpret, WHO)
    fwd, bwd = tile_params(cfg)
    drhs_rows, drhs_cols = (dims.n, dims.k) if transpose_rhs else (dims.k, dims.n)  # tgmm(dout, lhs) if transposed
    return (
        tiling(fwd, DEFAULT_QUANTIZED_FWD if quantized else DEFAULT_FWD, dims.m, dims.k, dims.n, interpret),
        tiling(bwd, DEFAULT_BWD, dims.m, dims.n, dims.k, interpret),
        tiling(bwd, DEFAULT_BWD, drhs_rows, dims.m, drhs_cols, interpret),
    )


def _decodes(weights) -> bool:
    """Packed codes of 4 or 8 bits (else NotImplementedError); v3 weights whose scale blocks hold whole
    16-row steps (others are scaled in memory first)."""
    if isinstance(weights, PackedGroupWeights):
        if weights.params.bits not in DECODE_BITS:
            raise NotImplementedError(
                f"{WHO} decodes codes of {DECODE_BITS} bits, got {weights.params.bits} ({weights.params.mode})"
            )
        return True
    return weights.block % MIN_BLOCK == 0


def _fp8_forward(tiling: TritonGroupedMatmulTiling, weights) -> TritonGroupedMatmulTiling | None:
    """The forward's tiling multiplying FP8 by FP8 (one K step a scale block of 16 to 256 rows, a power of
    two), or None for weights it cannot (then lhs is rounded through FP8 in memory first)."""
    if not isinstance(weights, ScaledGroupWeights) or jnp.dtype(weights.data.dtype) != jnp.float8_e4m3fn:
        return None
    block = weights.block
    if block & (block - 1) or not MIN_BLOCK <= block <= MAX_FP8_STEP:
        return None
    return dataclasses.replace(tiling, block_k=block, fp8_lhs=True)


grouped_matmul_triton = implementation(
    gmm,
    tgmm,
    _tilings,
    """Grouped matmul `[M, K] x [G, K, N] -> [M, N]` (semantics: `grouped_matmul_reference`) on a GPU.

    Tiles from `cfg.fwd_params` (forward) and `cfg.bwd_params` (both backward products), or upstream's
    `cfg.block_m` / `block_k` / `block_n` for all three: `block_q` output rows, `block_k` contraction step,
    `block_d` output columns (each fitted to its dimension, at least 16), `num_warps`, `num_stages`.
    Products accumulate in float32 at full input precision, whatever `precision` asks. `interpret=None`
    compiles for the GPU (off a GPU that is an error: ask for `interpret=True`). Raises
    NotImplementedError for dtypes the kernels do not take. A `QuantizedArray` rhs (4- or 8-bit codes; other
    widths are declined) and a v3 rhs with `rhs_scale` (int8, float8_e4m3fn or float; K blocks of a multiple
    of 16 rows, else scaled in memory first) are decoded in the kernel and multiplied in lhs's dtype; with
    `fp8_lhs` and FP8 weights whose scale blocks are powers of two of 16 to 256 rows, the forward rounds lhs to
    FP8 on the fly and multiplies on FP8 tensor cores.
    """,
    decodes=_decodes,
    fp8_forward=_fp8_forward,
)
