"""MLA serving through a Pallas-Triton kernel: the latent rows written as XLA does, then the MLA kernel.

`multi_latent_ragged_page_attention_triton` states the call as the shared latent problem
(`_common.paged_attention.adapters.latent_batch`: the new rows scattered into the cache, in place under
donation; MQA over one latent head), cuts the queries in tiles (`prepare_tiles`), runs `_kernel.partial_sums`
and merges its splits with the shared `finalize`. These are inference ops, but they must not break the
gradient of a model around them: the custom VJP's backward is the shared plain-JAX core's (recomputed), so
a gradient through the kernel is exact.

Declined with NotImplementedError before tracing (`platform="auto"` then runs XLA): queries that are not
float16/bfloat16/float32, caches that are not those or float8 (int8 only with scales), latent widths above
`MAX_LATENT`, caches of 2**31 rows or more.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ejkernel.kernels._common.device import num_sms
from ejkernel.kernels._common.differentiation import differentiated_as
from ejkernel.kernels._common.paged_attention.adapters import latent_batch, latent_options, written
from ejkernel.kernels._common.paged_attention.core_math import max_tiles, span_bound
from ejkernel.kernels._common.paged_attention.jax_core import default_block_q, paged_attention_core
from ejkernel.kernels._common.paged_attention.kv_cache import rope_column
from ejkernel.kernels._common.paged_attention.problem import PagedBatch
from ejkernel.kernels._common.paged_attention.tiles import finish_tiles, prepare_tiles
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.multi_latent_ragged_page_attention._kernel import (
    TritonLatentPagedStatic,
    TritonLatentPagedTiling,
    partial_sums,
)

WHO = "triton multi_latent_ragged_page_attention"
SUPPORTED_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))
FP8_CACHES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))  # read as stored, converted in registers
MAX_LATENT = 1024  # the [block_h, latent] float32 accumulator lives in registers
ACC_PER_WARP = 2048  # accumulator elements per warp where 8 warps pay off (64 registers a thread)
SMEM_BUDGET = 160 * 1024  # bytes of query rows and pipelined cache tiles a program may keep in shared memory


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, pl.next_power_of_2(max(int(n), 1)))


def _shared_bytes(block_h: int, block_k: int, stages: int, dims: TritonLatentPagedStatic, itemsize: int) -> int:
    width = dims.latent_tile + dims.rope_tile
    return (block_h + stages * block_k) * width * itemsize


def check_servable(
    dims: TritonLatentPagedStatic, query_dtypes, cache_dtype, cache_rows: int, scaled: bool = False
) -> None:
    """NotImplementedError for a call the kernel cannot serve (read from shapes and dtypes only, before tracing);
    `scaled`: the cache comes with per-row scales (an int8 cache needs them)."""
    for dtype in query_dtypes:
        if jnp.dtype(dtype) not in SUPPORTED_DTYPES:
            raise NotImplementedError(f"{WHO} takes float16/bfloat16/float32 queries, got {jnp.dtype(dtype)}")
    cache = jnp.dtype(cache_dtype)
    if cache not in SUPPORTED_DTYPES + FP8_CACHES + ((jnp.dtype(jnp.int8),) if scaled else ()):
        hint = "; int8 ones with per-token scales only" if cache == jnp.int8 else ""
        raise NotImplementedError(f"{WHO} takes float8/16/32 caches, got {cache}{hint}")
    if dims.latent_tile > MAX_LATENT:
        raise NotImplementedError(f"{WHO} takes latent widths up to {MAX_LATENT}, got {dims.latent}")
    if cache_rows >= 2**31:
        raise NotImplementedError(f"{WHO} indexes cache rows in int32: the cache has too many rows")


def plan(dims: TritonLatentPagedStatic, batch: PagedBatch, tiling, interpret: bool) -> TritonLatentPagedTiling:
    """The kernel's tiling for `batch` (the fields set in `tiling` win)."""
    given = {} if tiling is None else tiling.overrides()
    itemsize = max(jnp.dtype(batch.queries.dtype).itemsize, jnp.dtype(batch.key_rows.dtype).itemsize)
    heads = dims.num_heads

    block_h = given.get("block_h", 64 if dims.latent_tile <= 512 else 32)
    block_k = given.get("block_k", 64 if itemsize <= 2 else 16)  # H200, 64 x 8192 x 128 heads: 0.845 ms; 32: 0.935
    stages = given.get("num_stages", 2)
    while (
        "block_h" not in given
        and block_h > 16
        and _shared_bytes(block_h, block_k, stages, dims, itemsize) > SMEM_BUDGET
    ):
        block_h //= 2
    # A tile: one query's heads, or (few heads) as many queries as fill a program's rows, at most the mean.
    block_q = max(1, min(default_block_q(batch), block_h // heads))
    rows = _pow2(block_q * heads)
    block_h = min(block_h, rows)
    warps = given.get("num_warps", 8 if block_h * dims.latent_tile >= 8 * ACC_PER_WARP else 4)

    splits = given.get("num_splits")
    if splits is None:  # enough programs for every SM, each split at least 4 steps long
        programs = max_tiles(batch.num_tokens, batch.num_seqs, block_q) * (rows // block_h)
        sms = num_sms()
        longest = max(1, span_bound(batch.static, block_q) // (4 * block_k))
        splits = max(1, min(32, longest, round(sms / max(programs, 1))))
    return TritonLatentPagedTiling(
        block_q=block_q,
        rows=rows,
        block_h=block_h,
        block_k=block_k,
        num_splits=int(splits),
        num_warps=warps,
        num_stages=stages,
        interpret=interpret,
    )


def _forward(dims: TritonLatentPagedStatic, t: TritonLatentPagedTiling, batch: PagedBatch) -> jax.Array:
    width = batch.static.head_dim
    tiles, meta, q_tiles, _ = prepare_tiles(batch, t.block_q, t.rows, width)
    acc, m, denom = partial_sums(batch, dims, meta, q_tiles.reshape(-1, width), t)
    lift = lambda x: x[:, :, None]  # the one kv head: [S, R, Hkv = 1, rows, ...]
    return finish_tiles(batch, tiles, t.block_q, lift(acc), lift(m), lift(denom))[..., : dims.latent]


def _core(latent: int, batch: PagedBatch) -> jax.Array:
    return paged_attention_core(batch)[..., :latent]


@functools.partial(
    jax.jit,
    static_argnames=(
        "softmax_scale", "sliding_window", "logits_soft_cap", "q_scale", "k_scale", "v_scale", "dims", "tiling",
        "interpret",
    ),
)  # fmt: skip
def _run(*args, dims, tiling, interpret, **options):
    batch = latent_batch(*args, **options)
    reference = functools.partial(_core, dims.latent)
    if batch.num_tokens == 0:
        return written(reference(batch).astype(args[0].dtype), batch, args[4])
    t = plan(dims, batch, tiling, interpret)
    out = differentiated_as(reference, functools.partial(_forward, dims, t))(batch)
    return written(out.astype(args[0].dtype), batch, args[4])


def multi_latent_ragged_page_attention_triton(
    queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
    /, *, softmax_scale=None, sliding_window=None, logits_soft_cap=None, mask_value=None, q_scale=None, k_scale=None,
    v_scale=None, kv_cache_scales=None, cfg=None, interpret=None,
):  # fmt: skip
    """`(out [T, Hq, L], updated kv_cache)` (and the updated `kv_cache_scales` with them): see
    `ejkernel.modules.multi_latent_ragged_page_attention`.

    Trusts its arguments (the public functions check them): `keys_values [T, L]`, `keys_pe [T, R]`,
    `block_tables` 1-D. `mask_value` is accepted and unused (masked positions are excluded exactly); of `cfg`
    (either MLA config) only `triton_tiling` counts. `interpret=None` compiles for the GPU (off a GPU it is an
    error: ask for `interpret=True`).
    """
    del mask_value
    latent = queries_nope.shape[-1]
    dims = TritonLatentPagedStatic(latent, queries_pe.shape[-1], rope_column(latent), queries_nope.shape[1])
    query_dtypes = (queries_nope.dtype, queries_pe.dtype)
    scaled = kv_cache_scales is not None
    check_servable(dims, query_dtypes, kv_cache.dtype, kv_cache.size // kv_cache.shape[-1], scaled)
    options = latent_options(
        queries_nope, queries_pe, softmax_scale=softmax_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
    return _run(
        queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
        dims=dims, tiling=getattr(cfg, "triton_tiling", None), interpret=resolve_interpret(interpret, WHO),
        kv_cache_scales=kv_cache_scales, **options,
    )  # fmt: skip
