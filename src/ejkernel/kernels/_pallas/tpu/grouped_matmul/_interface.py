"""Grouped matmul through Pallas Mosaic TPU kernels: the public-contract entry point and its tilings.

Same structure as the Triton path: `_kernel.gmm` forward, `gmm` with the other transpose for dlhs and
`_kernel.tgmm` for drhs, wired by `_common.grouped_matmul.grouped_vjp`. Off TPU the kernels run in TPU
interpret mode (`pltpu.InterpretParams()`), which is how CPU CI checks them.
"""

from __future__ import annotations

import jax.numpy as jnp

from ejkernel.kernels._common.grouped_matmul import implementation, tile_params
from ejkernel.kernels._pallas.tpu import resolve_interpret
from ejkernel.kernels._pallas.tpu.grouped_matmul._kernel import TpuGroupedMatmulTiling, gmm, tgmm

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
DEFAULT_BLOCKS = (256, 512, 512)  # output rows, contraction step, output columns
WHO = "pallas tpu grouped_matmul"


# Compiled blocks are multiples of these (output rows, contraction step, output columns) or whole dimensions:
# 8 where a block's second-minor dimension runs along it, 128 where its minor one does. gmm's lhs tiles are
# [rows, steps]; tgmm's x tiles are [steps, rows] (its rows are x's columns).
GMM_GRANULES = (8, 128, 128)
TGMM_GRANULES = (128, 8, 128)


def tiling(params, rows: int, contraction: int, cols: int, interpret, granules=GMM_GRANULES) -> TpuGroupedMatmulTiling:
    """A product's tiles from config params (`block_q`, `block_k`, `block_d`; None: defaults), each at most
    its dimension (a block as large as the dimension always fits the TPU tiling). Compiled, a (power-of-two)
    block below its granule is raised to it; interpret mode takes any block."""
    given = [None if params is None else getattr(params, f) for f in ("block_q", "block_k", "block_d")]
    blocks = [d if g is None else g for g, d in zip(given, DEFAULT_BLOCKS, strict=True)]
    if interpret is False:
        blocks = [max(b, granule) for b, granule in zip(blocks, granules, strict=True)]
    return TpuGroupedMatmulTiling(
        *(min(b, size) for b, size in zip(blocks, (rows, contraction, cols), strict=True)), interpret
    )


def _tilings(dims, lhs, *, cfg, interpret, precision, transpose_rhs, quantized):
    """(output rows, contraction, output columns) tiles of the forward, dlhs and drhs products (quantized
    weights are declined before)."""
    del quantized
    if jnp.dtype(lhs.dtype) not in SUPPORTED_DTYPES:
        raise NotImplementedError(f"{WHO} takes float32/bfloat16, got {lhs.dtype}")
    interpret = resolve_interpret(interpret)
    fwd, bwd = tile_params(cfg)
    bwd = bwd or fwd
    drhs_rows, drhs_cols = (dims.n, dims.k) if transpose_rhs else (dims.k, dims.n)  # tgmm(dout, lhs) if transposed
    return (
        tiling(fwd, dims.m, dims.k, dims.n, interpret),
        tiling(bwd, dims.m, dims.n, dims.k, interpret),
        tiling(bwd, drhs_rows, dims.m, drhs_cols, interpret, TGMM_GRANULES),
    )


grouped_matmul_tpu = implementation(
    gmm,
    tgmm,
    _tilings,
    """Grouped matmul `[M, K] x [G, K, N] -> [M, N]` (semantics: `grouped_matmul_reference`) on a TPU.

    Tiles from `cfg.fwd_params` / `cfg.bwd_params`, or upstream's `cfg.block_m` / `block_k` / `block_n` for
    all three products (`block_q` output rows, `block_k` contraction step, `block_d` output columns;
    defaults 256 x 512 x 512; see `tiling`). Products accumulate in float32 at full input
    precision. `interpret=None` compiles on a TPU and runs TPU interpret mode elsewhere; a
    `pltpu.InterpretParams` is used as given.
    """,
)
