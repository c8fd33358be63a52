"""The serving ops' Pallas-Triton core: tiling plan, query tiles in, partial sums out, plain-JAX backward.

`paged_attention_triton_core(batch, cfg)` refuses (NotImplementedError, before tracing a kernel) what
the kernel cannot serve, cuts the queries in tiles, gathers each tile's query rows (`tile_rows`),
runs the kernel and merges its splits with the shared `finalize`. These are inference ops, but they
must not break the gradient of a model around them: the custom VJP's backward is the shared plain-JAX
core's (`_common.paged_attention.jax_core`, recomputed, every input), so a gradient through the kernel is exact.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from ejkernel.kernels._common.differentiation import differentiated_as
from ejkernel.kernels._common.paged_attention.core_math import max_tiles, span_bound
from ejkernel.kernels._common.paged_attention.implementations import config_tiling
from ejkernel.kernels._common.paged_attention.jax_core import default_block_q, paged_attention_core
from ejkernel.kernels._common.paged_attention.problem import PagedBatch
from ejkernel.kernels._common.paged_attention.tiles import finish_tiles, prepare_tiles
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.paged_attention._kernel import TritonPagedTiling, partial_sums

SUPPORTED_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))
FP8_CACHES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))
"""Cache dtypes read as they are stored and converted in registers: half a 16-bit cache's bytes per row."""
INT8 = jnp.dtype(jnp.int8)  # read likewise, with per-row scales only
MAX_WIDTH = 256
MAX_ROWS = 128  # query rows (queries x grouped heads) of one tile
TARGET_PROGRAMS = 2 * 132  # about two programs per SM of an H100/H200
WHO = "triton paged attention"


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(n - 1, 0).bit_length())


def _narrow(batch: PagedBatch) -> bool:
    """An 8-bit cache: half a 16-bit row's bytes for the same work per row, so its loads need more in flight
    (longer steps, a deeper pipeline, twice the programs); an H200's float8 decode went from 0.60 to 0.39 ms."""
    return jnp.dtype(batch.key_rows.dtype).itemsize == 1


def _splits(batch: PagedBatch, block_q: int, block_k: int, tiles: int) -> int:
    """Key splits: enough programs to fill the GPU, but each split at least 4 steps long."""
    st = batch.static
    programs = TARGET_PROGRAMS * (2 if _narrow(batch) else 1)
    most = max(1, span_bound(st, block_q) // (4 * block_k))
    return max(1, min(16, most, -(-programs // (max(1, tiles) * st.num_kv_heads))))


def plan(batch: PagedBatch, cfg, interpret: bool | None) -> TritonPagedTiling:
    """The kernel's tiling for `batch` (cfg fields win); NotImplementedError for what it cannot serve."""
    st = batch.static
    compute = jnp.dtype(st.compute_dtype) if st.compute_dtype is not None else jnp.dtype(batch.queries.dtype)
    if compute not in SUPPORTED_DTYPES:
        raise NotImplementedError(f"{WHO} takes float16/bfloat16/float32 queries, got {compute}")
    cache = jnp.dtype(batch.key_rows.dtype)
    scaled = batch.key_scales is not None
    if cache not in SUPPORTED_DTYPES + FP8_CACHES + ((INT8,) if scaled else ()):
        hint = "; int8 ones with per-token scales only" if cache == jnp.int8 else ""
        raise NotImplementedError(f"{WHO} takes float8/16/32 caches, got {cache}{hint}")
    if scaled != (batch.value_scales is not None):
        raise NotImplementedError(f"{WHO} takes key and value scales together")
    width = _pow2(st.head_dim)
    if width > MAX_WIDTH:
        raise NotImplementedError(f"{WHO} supports head dims up to {MAX_WIDTH}, got {st.head_dim}")
    if max(batch.key_rows.shape[0], batch.value_rows.shape[0]) >= 2**31:
        raise NotImplementedError(f"{WHO} indexes cache rows in int32: the cache has too many rows")
    params = config_tiling(cfg, st.rows.page_size)
    group = batch.num_heads // st.num_kv_heads
    block_q = params.block_q or min(default_block_q(batch), max(1, MAX_ROWS // group))
    narrow = _narrow(batch)
    block_k = max(16, params.block_k or (32 if width > 128 else 128 if narrow else 64))  # tl.dot takes >= 16 rows
    splits = params.num_splits or st.num_splits or _splits(batch, block_q, block_k, batch.num_tokens // block_q)
    return TritonPagedTiling(
        block_q=block_q,
        block_k=block_k,
        rows=_pow2(block_q * group),
        width=width,
        num_splits=int(splits),
        num_warps=params.num_warps or 4,
        num_stages=params.num_stages or (3 if narrow else 2),
        interpret=resolve_interpret(interpret, "triton paged attention"),
    )


def short_pass(batch: PagedBatch, cfg, t: TritonPagedTiling) -> TritonPagedTiling | None:
    """The tiling of a first pass over the short sequences (decode, speculative steps) of a batch that may mix
    them with prefill chunks, or None when one pass serves the batch.

    One tile size for all sequences makes every one-query sequence fill a prefill-sized tile: 32 queries x
    4 grouped heads = 128 rows of logits per key for 4 real ones, so a decode row costs 32 times its
    matmul work. Sequences of at most `short` queries (the tile of 16 rows, `16 // G` queries) run in
    their own pass with one tile each; the rest (prefill chunks) in the pass of tiling `t`. Not when the
    config fixes `block_q`, or the batch's tile is short already, or the sequences average more than two
    prefill tiles of queries: then the short ones' waste is a small part of the work and one launch, in
    which decode tiles stream keys while prefill tiles compute, was faster on an H200 (24 x 1@8192 beside
    8 x 1024@4096: 2.56 ms in one pass, 3.16 in two; 60 x 1@4096 beside 4 x 512@2048: 0.85 and 0.65).
    """
    short = short_queries(batch)
    params = config_tiling(cfg, batch.static.rows.page_size)
    if params.block_q or t.block_q <= short or batch.num_tokens > 2 * t.block_q * batch.num_seqs:
        return None
    return _one_tile_each(batch, cfg, t, short)


def short_queries(batch: PagedBatch) -> int:
    """The most queries a sequence of the short pass has: those of 16 tile rows (`16 // G`, at least 1)."""
    return max(1, 16 // (batch.num_heads // batch.static.num_kv_heads))


def _one_tile_each(batch: PagedBatch, cfg, t: TritonPagedTiling, block_q: int) -> TritonPagedTiling:
    """`t` with tiles of `block_q` queries, its key splits counted for one tile a sequence."""
    st, group = batch.static, batch.num_heads // batch.static.num_kv_heads
    splits = config_tiling(cfg, st.rows.page_size).num_splits or st.num_splits
    splits = splits or _splits(batch, block_q, t.block_k, batch.num_seqs)
    return dataclasses.replace(t, block_q=block_q, rows=_pow2(block_q * group), num_splits=int(splits))


def short_sequences_triton(batch: PagedBatch, cfg=None, interpret: bool | None = None):
    """The short pass of `paged_attention_triton_core` alone, for a core that serves the long sequences itself:
    `(out [T, Hq, D], lse [T, Hq], short [N] bool)`, the sequences of at most `short_queries(batch)` queries
    run in one tile each, every other token 0 (lse -inf). No VJP (the caller's); NotImplementedError for what
    the kernel cannot serve."""
    t = _one_tile_each(batch, cfg, plan(batch, cfg, interpret), short_queries(batch))
    short = batch.query_len <= t.block_q
    only_short = dataclasses.replace(batch, query_len=jnp.where(short, batch.query_len, 0))
    return *_partial_pass(t, only_short, True, num_tiles=batch.num_seqs), short


def _partial_pass(t: TritonPagedTiling, batch: PagedBatch, with_lse: bool, num_tiles: int | None = None):
    tiles, meta, q_tiles, alibi = prepare_tiles(batch, t.block_q, t.rows, t.width, num_tiles)
    acc, m, denom = partial_sums(batch, meta, q_tiles, alibi, t)
    return finish_tiles(batch, tiles, t.block_q, acc, m, denom, with_lse)


def _forward(t: TritonPagedTiling, short: TritonPagedTiling | None, with_lse: bool, batch: PagedBatch):
    if short is None:
        return _partial_pass(t, batch, with_lse)
    # Each sequence goes to one pass (the other sees it with no query); every token is written by one pass.
    is_short = batch.query_len <= short.block_q
    only = lambda keep: dataclasses.replace(batch, query_len=jnp.where(keep, batch.query_len, 0))
    long_seqs = min(batch.num_seqs, batch.num_tokens // (short.block_q + 1))
    long_tiles = max_tiles(batch.num_tokens, long_seqs, t.block_q)
    firsts = _partial_pass(short, only(is_short), with_lse, num_tiles=batch.num_seqs)
    rests = _partial_pass(t, only(~is_short), with_lse, num_tiles=long_tiles)
    if not with_lse:
        return firsts + rests
    return firsts[0] + rests[0], jnp.maximum(firsts[1], rests[1])


def paged_attention_triton_core(batch: PagedBatch, cfg=None, interpret: bool | None = None, with_lse: bool = False):
    """`[T, Hq, D]` paged attention of `batch` through the Pallas-Triton kernel (`interpret=True`: interpreted);
    `with_lse`: `(out, lse [T, Hq] float32)`, as the plain-JAX core gives them."""
    t = plan(batch, cfg, interpret)
    reference = functools.partial(paged_attention_core, with_lse=with_lse)
    if batch.num_tokens == 0 or batch.num_seqs == 0:
        return reference(batch)
    # Inference ops must not break the gradient of a model around them: the plain-JAX core's exact gradient.
    forward = functools.partial(_forward, t, short_pass(batch, cfg, t), with_lse)
    return differentiated_as(reference, forward)(batch)
