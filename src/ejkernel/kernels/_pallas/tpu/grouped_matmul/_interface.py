"""Grouped matmul through Pallas Mosaic TPU kernels: the public-contract entry point and its tilings.

Same structure as the Triton path: `_kernel.gmm` forward, `gmm` with the other transpose for dlhs and
`_kernel.tgmm` for drhs, wired by `_common.grouped_matmul.grouped_vjp`. Off TPU the kernels run in TPU
interpret mode (`pltpu.InterpretParams()`), which is how CPU CI checks them.
"""

from __future__ import annotations

import jax.numpy as jnp

from ejkernel.kernels._common.grouped_matmul import implementation
from ejkernel.kernels._pallas.tpu import resolve_interpret
from ejkernel.kernels._pallas.tpu.grouped_matmul._kernel import Tiling, gmm, tgmm

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
DEFAULT_BLOCKS = (256, 512, 512)  # output rows, contraction step, output columns
WHO = "pallas tpu grouped_matmul"


def tiling(params, rows: int, contraction: int, cols: int, interpret) -> Tiling:
    """A product's tiles from config params (`block_q`, `block_k`, `block_d`; None: defaults), each at most
    its dimension (a block as large as the dimension always fits the TPU tiling)."""
    given = [None if params is None else getattr(params, f) for f in ("block_q", "block_k", "block_d")]
    bm, bk, bn = (d if g is None else g for g, d in zip(given, DEFAULT_BLOCKS, strict=True))
    fitted = [min(b, size) for b, size in zip((bm, bk, bn), (rows, contraction, cols), strict=True)]
    if interpret is False:
        for block, size, granule, name in zip(fitted, (rows, contraction, cols), (8, 128, 128), "mkn", strict=True):
            if block != size and block % granule:
                raise NotImplementedError(f"{WHO}: block_{name}={block} must be a multiple of {granule} or {size}")
    return Tiling(*fitted, interpret)


def _tilings(dims, lhs, *, cfg, interpret, precision, transpose_rhs):
    """(output rows, contraction, output columns) tiles of the forward, dlhs and drhs products."""
    if jnp.dtype(lhs.dtype) not in SUPPORTED_DTYPES:
        raise NotImplementedError(f"{WHO} takes float32/bfloat16, got {lhs.dtype}")
    interpret = resolve_interpret(interpret)
    fwd = getattr(cfg, "fwd_params", None)
    bwd = getattr(cfg, "bwd_params", None) or fwd
    return (
        tiling(fwd, dims.m, dims.k, dims.n, interpret),
        tiling(bwd, dims.m, dims.n, dims.k, interpret),
        tiling(bwd, dims.k, dims.m, dims.n, interpret),
    )


grouped_matmul_tpu = implementation(
    gmm,
    tgmm,
    _tilings,
    """Grouped matmul `[M, K] x [G, K, N] -> [M, N]` (semantics: `grouped_matmul_reference`) on a TPU.

    Tiles from `cfg.fwd_params` / `cfg.bwd_params` (`block_q` output rows, `block_k` contraction step,
    `block_d` output columns; defaults 256 x 512 x 512). Products accumulate in float32 at full input
    precision. `interpret=None` compiles on a TPU and runs TPU interpret mode elsewhere; a
    `pltpu.InterpretParams` is used as given.
    """,
)
