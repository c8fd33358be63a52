"""The serving ops on Hopper: prefill chunks in Mosaic GPU flash attention tiles, short sequences on the Triton core.

`paged_attention_mosaic_gpu_core(batch, cfg)` declines (NotImplementedError, before tracing a kernel) what
the prefill tiles do not serve, so `platform="auto"` falls back to the Triton core: 16-bit queries and
cache of one dtype, head dim 64 or 128, plain causal attention (no sliding window, soft cap, sinks, ALiBi,
query-query bias, first keys or quantised cache), a cache whose rows of one (page, position) hold every kv
head (`[pages, page_size, slots, width]`, `width` the head dim), pages of a multiple of 8 positions that
tile 128 keys (or are whole multiples of them), and a batch with room for a 128-query chunk (and, unless sequences
are routed by their queries, at least `MIN_MEAN_QUERIES` queries a sequence on average).

Two passes, each sequence in one: the Triton core's short-sequence pass (`short_sequences_triton`: decode rows, one
small tile a sequence, at decode bandwidth) and the prefill tiles (`_kernel`) over the rest; each token takes its row
from the pass that holds it. A sequence of a few queries more than the short pass takes (`16 // G`: speculative steps)
fills a 128-query tile mostly with rows that compute what nobody reads, so with `long_queries` the tiles take only
sequences of at least that many queries and the Triton core the others, its passes chosen on the device (`route`: its
short pass alone while no sequence lies between, no tiles without sequences for them). `in_place`: the tiles read their
queries from the batch's rows and write theirs into the Triton pass's output (no packed copy of the queries, no gather
of the tiles' rows, no select; the default: on an H200 the bench's mixed batches ran 4-7% faster, the prefill chunks of
60 x 1 + 4 x 512 at 0.60-0.61 of flash attention's TFLOP/s against 0.48-0.52 out of place). The Triton passes are
reached as the op modules reach a backend, through their `"module:attribute"` names (`ejkernel.registry.resolve`), never
imported. The gradient is the shared plain-JAX core's, as the Triton core's is.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from ejkernel.kernels._common.device import is_hopper
from ejkernel.kernels._common.differentiation import differentiated_as
from ejkernel.kernels._common.paged_attention.jax_core import paged_attention_core
from ejkernel.kernels._common.paged_attention.problem import PagedBatch
from ejkernel.kernels._pallas.gpu.flash_attention._interface import kernel_choices
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import (
    COMPUTE_WGS,
    CTA_ROWS,
    ROWS,
    SMEM_BYTES,
    MosaicGpuFlashStatic,
)
from ejkernel.kernels._pallas.gpu.paged_attention._tiling import BLOCK, MosaicGpuPagedStatic
from ejkernel.registry import resolve

WHO = "mosaic gpu paged attention"
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
HEAD_DIMS = (64, 128)
MIN_MEAN_QUERIES = 32
"""Served from this many queries a sequence on average: the bench's 60 x 1 + 4 x 512 batch (33) measured 1.22x
faster than the Triton core on an H200. A sequence of more queries than the Triton short pass takes fills a 128-query
tile, so a batch of speculative steps (8-16 draft tokens a sequence) would run tiles mostly of rows nobody reads;
measured 1.98x slower at 32 draft tokens (`exp/s31_spec_decode.py`), so such batches stay on Triton. (Not with
`long_queries`, which routes each sequence.)"""
LONG_QUERIES = 64
"""With routing by sequence: the fewest queries of a sequence in the prefill tiles, half a 128-query tile (at 32, a
quarter, draft batches ran 1.98x slower in the tiles than on the Triton core, `exp/s31_spec_decode.py`). Not the
default: on an H200 (`exp/s32_prefill3.py`) routing cost the mixed batches 2-5% (the 60 x 1 + 4 x 512 prefill at
0.55 of flash attention against 0.60-0.61 unrouted), kept 64 x 8-32 draft batches within 5-8% of the Triton core
(in the tiles, 64 x 32 ran 1.94x slower), but beside a 512-query chunk ran 64 x 32 drafts at 1.137 ms against the
Triton core's 0.783 (the tiles' 1.364)."""
SHORT_SEQUENCES = "ejkernel.kernels._triton.paged_attention:short_sequences_triton"
SHORT_QUERIES = "ejkernel.kernels._triton.paged_attention:short_queries"
TRITON_CORE = "ejkernel.kernels._triton.paged_attention:paged_attention_triton_core"
_UNSERVED_OPTIONS = {
    "kv_start": "first keys",
    "sinks": "sinks",
    "alibi_slopes": "ALiBi",
    "qq_bias": "a query-query bias",
    "key_scales": "per-token cache scales",
}


def _check_options(batch: PagedBatch) -> None:
    """NotImplementedError for the options, dtypes and head dims the prefill tiles do not serve."""
    st = batch.static
    for field, what in _UNSERVED_OPTIONS.items():
        if getattr(batch, field) is not None:
            raise NotImplementedError(f"{WHO} does not take {what}")
    if st.soft_cap is not None or st.window is not None or not st.causal or st.value_scale is not None:
        raise NotImplementedError(f"{WHO} serves plain causal attention: no soft cap, window or value scale")
    dtype = jnp.dtype(batch.queries.dtype)
    if dtype not in DTYPES:
        raise NotImplementedError(f"{WHO} takes bfloat16/float16 queries, got {dtype}")
    caches = {jnp.dtype(batch.key_rows.dtype), jnp.dtype(batch.value_rows.dtype)}
    if st.compute_dtype not in (None, dtype.name) or caches != {dtype}:
        raise NotImplementedError(f"{WHO} takes a cache and compute dtype of the queries' {dtype}, got {caches}")
    if st.head_dim not in HEAD_DIMS or batch.key_rows.shape[1] != st.head_dim:
        raise NotImplementedError(
            f"{WHO} takes head dims {HEAD_DIMS} in cache rows as wide, got {st.head_dim} in {batch.key_rows.shape[1]}"
        )


def _cache_layout(batch: PagedBatch, stages: int, tiles_per_cta: int, in_place: bool) -> MosaicGpuPagedStatic:
    """The cache as `[pages, page_size, slots, width]` (and the tiles' settings), or NotImplementedError."""
    rows, st = batch.static.rows, batch.static
    size = rows.page_size
    if size % 8 or (BLOCK % size and size % BLOCK):
        raise NotImplementedError(f"{WHO} takes pages of 8, 16, ..., 128 positions or multiples of 128, got {size}")
    slots = rows.slot_stride
    last = (st.num_kv_heads - 1) * rows.head_stride + max(rows.key_offset, rows.value_offset)
    whole = {batch.key_rows.shape[0], batch.value_rows.shape[0]} == {rows.num_pages * rows.page_stride}
    if rows.page_stride != size * slots or last >= slots or not whole:
        raise NotImplementedError(f"{WHO} reads caches of rows [pages, page_size, kv heads..., width] only")
    # shared memory: a 64-row query tile and log-sum-exp per warpgroup and tile, a ring of key and value tiles
    # (in place: and an untiled 64-row tile per warpgroup, one query tile a CTA)
    smem = COMPUTE_WGS * tiles_per_cta * ROWS * (2 * st.head_dim + 4) + stages * 2 * BLOCK * st.head_dim * 2
    smem += COMPUTE_WGS * ROWS * st.head_dim * 2 if in_place else 0
    if tiles_per_cta not in (1, 2) or stages < 2 or smem > SMEM_BYTES or (in_place and tiles_per_cta != 1):
        raise NotImplementedError(
            f"{WHO}: {tiles_per_cta} tiles a CTA and {stages} stages{' in place' if in_place else ''} do not fit "
            f"({smem} bytes)"
        )
    return MosaicGpuPagedStatic(
        size,
        rows.num_pages,
        slots,
        rows.head_stride,
        rows.key_offset,
        rows.value_offset,
        stages,
        tiles_per_cta,
        in_place,
    )


def long_sequences_bound(batch: PagedBatch, fewest: int) -> int:
    """A static bound on the sequences of at least `fewest` queries."""
    return min(batch.num_seqs, batch.num_tokens // fewest)


def plan(
    batch: PagedBatch,
    stages: int = 2,
    tiles_per_cta: int = 1,
    in_place: bool = True,
    long_queries: int | None = None,
) -> tuple[MosaicGpuFlashStatic, MosaicGpuPagedStatic]:
    """The prefill tiles' trace-time description; NotImplementedError for what they do not serve."""
    _check_options(batch)
    paged = _cache_layout(batch, stages, tiles_per_cta, in_place)
    st = batch.static
    if batch.num_tokens < CTA_ROWS + batch.num_seqs - 1:
        raise NotImplementedError(
            f"{WHO}: {batch.num_tokens} tokens over {batch.num_seqs} sequences leave no 128-query chunk beside "
            "one query a sequence (decode steps are the Triton core's)"
        )
    if long_queries is None and batch.num_tokens < MIN_MEAN_QUERIES * batch.num_seqs:
        raise NotImplementedError(
            f"{WHO}: {batch.num_tokens} tokens over {batch.num_seqs} sequences average fewer than "
            f"{MIN_MEAN_QUERIES} queries a sequence (speculative steps and decode-heavy batches are the Triton core's)"
        )
    choices = kernel_choices(st.head_dim, batch.queries.dtype, st.max_kv_len, None, BLOCK, 64, 2, True, True)
    flash = MosaicGpuFlashStatic(
        softmax_scale=float(st.softmax_scale),
        soft_cap=None,
        causal=True,
        window=None,
        q_len=CTA_ROWS,  # (per tile: the walk places the rows and masks them)
        kv_len=max(st.max_kv_len, 1),
        num_heads=batch.num_heads,
        num_kv_heads=st.num_kv_heads,
        block_k=BLOCK,
        stages=stages,
        block_k_dq=64,
        block_q_dkv=64,
        stages_bwd=2,
        q_tiles_per_cta=tiles_per_cta,
        **choices,
    )
    return flash, paged


def short_sequences(batch: PagedBatch, cfg=None, interpret: bool | None = None):
    """The Triton core's pass over the short sequences: `(out, lse, short [N] bool)` (`short_sequences_triton`)."""
    return resolve(SHORT_SEQUENCES)(batch, cfg, interpret)


SHORT_THEN_TILES, CORE_THEN_TILES, CORE_ALONE = range(3)


def route(batch: PagedBatch, long_queries: int):
    """Which passes a batch routed by queries runs, on the device (`lax.switch`'s index): `SHORT_THEN_TILES` (the
    Triton short pass, then the prefill tiles over the sequences of at least `long_queries` queries), or where some
    sequence lies between the two, `CORE_THEN_TILES` (the whole Triton core, then the tiles), or where none has so
    many, `CORE_ALONE` (the Triton core over the batch). A batch pays only for the passes it needs."""
    middle = jnp.any((batch.query_len > resolve(SHORT_QUERIES)(batch)) & (batch.query_len < long_queries))
    return jnp.where(jnp.any(batch.query_len >= long_queries), middle.astype(jnp.int32), CORE_ALONE)


def long_sequences(
    flash: MosaicGpuFlashStatic,
    paged: MosaicGpuPagedStatic,
    batch: PagedBatch,
    long,
    long_seqs: int | None = None,
    into=None,
):
    """`(out, lse, held [T] bool)` of the sequences `long` ([N] bool), in Mosaic GPU prefill tiles: the tokens they
    hold (`_kernel.prefill_tiles`). `long_seqs`: a static bound on their number (default: what the batch's
    shape allows beside the short pass), which sizes the launch. `into` (with `paged.in_place`): the other sequences'
    output, which `out` is with the tiles' rows written in."""
    from ejkernel.kernels._pallas.gpu.paged_attention._kernel import prefill_tiles  # loads Mosaic GPU

    if long_seqs is None:
        long_seqs = long_sequences_bound(batch, resolve(SHORT_QUERIES)(batch) + 1)
    return prefill_tiles(flash, paged, batch, long, long_seqs, into)


def join(short_pass, long_pass, with_lse: bool):
    """The short pass's `(out, lse)` and the long one's `(out, lse, held)` -> the batch's: each token's rows from
    the pass that holds it (the short pass's hold 0 and -inf where no sequence has the token)."""
    (short_out, short_lse), (out, lse, held) = short_pass, long_pass
    out = jnp.where(held[:, None, None], out.astype(short_out.dtype), short_out)
    return (out, jnp.where(held[:, None], lse, short_lse)) if with_lse else out


def triton_pass(
    batch: PagedBatch,
    cfg=None,
    interpret: bool | None = None,
    long_queries: int | None = None,
    whole_core: bool = False,
):
    """`(out, lse, long [N] bool)`: the Triton core's pass over the sequences that the prefill tiles do not take
    (`long`): its short pass (sequences of more queries are long), or with `long_queries` (sequences of fewer
    queries are not long) the short pass or, `whole_core`, the whole core (its short pass and its general tiles)."""
    if long_queries is None:
        out, lse, short = short_sequences(batch, cfg, interpret)
        return out, lse, ~short
    long = batch.query_len >= long_queries
    others = dataclasses.replace(batch, query_len=jnp.where(long, 0, batch.query_len))
    if whole_core:
        return *resolve(TRITON_CORE)(others, cfg, interpret, with_lse=True), long
    return *short_sequences(others, cfg, interpret)[:2], long


def tiles_pass(
    flash: MosaicGpuFlashStatic,
    paged: MosaicGpuPagedStatic,
    batch: PagedBatch,
    triton,
    with_lse: bool,
    long_seqs: int | None = None,
    long_queries: int | None = None,
):
    """The batch's `out` (`with_lse`: `(out, lse)`) from the Triton pass's `(out, lse, long)` (`triton_pass`) and the
    prefill tiles over the sequences `long`, joined (`join`) or written into the Triton pass's output in place."""
    out, lse, long = triton
    if long_seqs is None and long_queries is not None:
        long_seqs = long_sequences_bound(batch, long_queries)
    if not paged.in_place:
        return join((out, lse), long_sequences(flash, paged, batch, long, long_seqs), with_lse)
    out, tiles_lse, held = long_sequences(flash, paged, batch, long, long_seqs, into=out)
    return (out, jnp.where(held[:, None], tiles_lse, lse)) if with_lse else out


def _forward(flash, paged, cfg, interpret, with_lse: bool, long_seqs, long_queries, batch: PagedBatch):
    def then_tiles(whole_core: bool):
        def run(batch):
            triton = triton_pass(batch, cfg, interpret, long_queries, whole_core)
            return tiles_pass(flash, paged, batch, triton, with_lse, long_seqs, long_queries)

        return run

    if long_queries is None:
        return then_tiles(False)(batch)
    core_alone = lambda batch: resolve(TRITON_CORE)(batch, cfg, interpret, with_lse=with_lse)
    return lax.switch(route(batch, long_queries), [then_tiles(False), then_tiles(True), core_alone], batch)


def paged_attention_mosaic_gpu_core(
    batch: PagedBatch,
    cfg=None,
    interpret: bool | None = None,
    with_lse: bool = False,
    stages: int = 2,
    long_seqs: int | None = None,
    tiles_per_cta: int = 1,
    in_place: bool = True,
    long_queries: int | None = None,
):
    """`[T, Hq, D]` paged attention of `batch` (`with_lse`: and its log-sum-exp `[T, Hq]`), prefill chunks in Mosaic GPU
    tiles and short sequences on the Triton core (`cfg` tiles the Triton pass; `interpret` is its interpret mode);
    `stages`: the prefill tiles' key/value ring depth; `long_seqs`: the caller's promise that at most so many sequences
    have more queries than the short pass takes (fewer CTAs launched that compute nothing); `tiles_per_cta`: 2 runs
    tiles c and c + R/2 of the launch order in CTA c (half as many CTAs that compute nothing; the second tile's keys
    load while the first ends; out of place only); `in_place` (default): the tiles read their queries from the batch's
    rows and write theirs into the Triton pass's output (one tile a CTA); `long_queries`: the tiles take only sequences
    of at least so many queries (`LONG_QUERIES` is a choice), the Triton core the others (`route`), in place of the
    short pass and a static floor on the mean queries a sequence.
    NotImplementedError for what it does not serve (and off Hopper GPUs)."""
    if not is_hopper():
        raise NotImplementedError(
            f"{WHO} needs a Hopper GPU (compute capability 9.x), not {jax.devices()[0].device_kind}"
        )
    flash, paged = plan(batch, stages, tiles_per_cta, in_place, long_queries)
    reference = functools.partial(paged_attention_core, with_lse=with_lse)
    if batch.num_tokens == 0 or batch.num_seqs == 0:
        return reference(batch)
    forward = functools.partial(_forward, flash, paged, cfg, interpret, with_lse, long_seqs, long_queries)
    return differentiated_as(reference, forward)(batch)
