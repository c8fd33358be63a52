"""The serving ops' Pallas-Triton core: tiling plan, query tiles in, partial sums out, plain-JAX backward.

`paged_attention_triton_core(batch, cfg)` refuses (NotImplementedError, before tracing a kernel) what
the kernel cannot serve, cuts the queries in tiles, gathers each tile's query rows (`tile_rows`),
runs the kernel and merges its splits with the shared `finalize`. These are inference ops, but they
must not break the gradient of a model around them: the custom VJP's backward is the shared plain-JAX
core's (`_common.paged_attention.jax_core`, recomputed, every input), so a gradient through the kernel is exact.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from ejkernel.kernels._common.differentiation import differentiated_as
from ejkernel.kernels._common.paged_attention.core_math import span_bound
from ejkernel.kernels._common.paged_attention.implementations import config_tiling
from ejkernel.kernels._common.paged_attention.jax_core import default_block_q, paged_attention_core
from ejkernel.kernels._common.paged_attention.problem import PagedBatch
from ejkernel.kernels._common.paged_attention.tiles import finish_tiles, prepare_tiles
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.paged_attention._kernel import TritonPagedTiling, partial_sums

SUPPORTED_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))
MAX_WIDTH = 256
MAX_ROWS = 128  # query rows (queries x grouped heads) of one tile
TARGET_PROGRAMS = 2 * 132  # about two programs per SM of an H100/H200
WHO = "triton paged attention"


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(n - 1, 0).bit_length())


def plan(batch: PagedBatch, cfg, interpret: bool | None) -> TritonPagedTiling:
    """The kernel's tiling for `batch` (cfg fields win); NotImplementedError for what it cannot serve."""
    st = batch.static
    compute = jnp.dtype(st.compute_dtype) if st.compute_dtype is not None else jnp.dtype(batch.queries.dtype)
    for name, dtype in (("queries", compute), ("cache", jnp.dtype(batch.key_rows.dtype))):
        if dtype not in SUPPORTED_DTYPES:
            raise NotImplementedError(f"{WHO} takes float16/bfloat16/float32 {name}, got {dtype}")
    width = _pow2(st.head_dim)
    if width > MAX_WIDTH:
        raise NotImplementedError(f"{WHO} supports head dims up to {MAX_WIDTH}, got {st.head_dim}")
    if max(batch.key_rows.shape[0], batch.value_rows.shape[0]) >= 2**31:
        raise NotImplementedError(f"{WHO} indexes cache rows in int32: the cache has too many rows")
    params = config_tiling(cfg, st.rows.page_size)
    group = batch.num_heads // st.num_kv_heads
    block_q = params.block_q or min(default_block_q(batch), max(1, MAX_ROWS // group))
    block_k = max(16, params.block_k or (64 if width <= 128 else 32))  # tl.dot needs 16 rows at least
    splits = params.num_splits or st.num_splits
    if not splits:  # enough programs to fill the GPU, but each split at least 4 steps long
        tiles = max(1, batch.num_tokens // block_q)
        most = max(1, span_bound(st, block_q) // (4 * block_k))
        splits = max(1, min(16, most, -(-TARGET_PROGRAMS // (tiles * st.num_kv_heads))))
    return TritonPagedTiling(
        block_q=block_q,
        block_k=block_k,
        rows=_pow2(block_q * group),
        width=width,
        num_splits=int(splits),
        num_warps=params.num_warps or 4,
        num_stages=params.num_stages or 2,
        interpret=resolve_interpret(interpret, "triton paged attention"),
    )


def _forward(t: TritonPagedTiling, with_lse: bool, batch: PagedBatch):
    tiles, meta, q_tiles, alibi = prepare_tiles(batch, t.block_q, t.rows, t.width)
    acc, m, denom = partial_sums(batch, meta, q_tiles, alibi, t)
    return finish_tiles(batch, tiles, t.block_q, acc, m, denom, with_lse)


def paged_attention_triton_core(batch: PagedBatch, cfg=None, interpret: bool | None = None, with_lse: bool = False):
    """`[T, Hq, D]` paged attention of `batch` through the Pallas-Triton kernel (`interpret=True`: interpreted);
    `with_lse`: `(out, lse [T, Hq] float32)`, as the plain-JAX core gives them."""
    t = plan(batch, cfg, interpret)
    reference = functools.partial(paged_attention_core, with_lse=with_lse)
    if batch.num_tokens == 0 or batch.num_seqs == 0:
        return reference(batch)
    # Inference ops must not break the gradient of a model around them: the plain-JAX core's exact gradient.
    return differentiated_as(reference, functools.partial(_forward, t, with_lse))(batch)
