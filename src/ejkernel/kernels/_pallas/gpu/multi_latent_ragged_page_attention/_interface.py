"""MLA serving through a Mosaic GPU kernel (Hopper): the latent rows written as XLA does, then the wgmma kernel.

`multi_latent_ragged_page_attention_mosaic_gpu` states the call as the shared latent problem
(`_common.paged_attention.adapters.latent_batch`: the new rows scattered into the cache, in place under
donation), cuts the queries in tiles (`prepare_tiles`), runs `_kernel.partial_sums` over 64 query rows per CTA
and merges its splits with the shared `finalize`. A gradient goes through the shared plain-JAX core (recomputed),
as the Triton implementation's does.

With 64 heads or more every query is its own tile (its heads in CTAs of 64); with fewer (a divisor of 64), a tile
holds the heads of `64 / heads` consecutive queries of a sequence, so that a prefill chunk fills the CTA's rows
(a decode token's tile then fills `heads` of the 64 rows: on an H200 a 16-head decode step read at 0.76 of copy
bandwidth, the Triton core's at 0.63). Prefill tokens are served too, each reading its sequence's cache as a
decode token does. Declined with NotImplementedError before tracing (`platform="auto"` then runs Triton): devices
other than Hopper GPUs; queries and cache not all bfloat16 or all float16 (float8 and int8 caches, per-row
scales); head counts neither a multiple nor a divisor of 64; latent widths not a multiple of 128 or
above 512; RoPE widths not a multiple of 64; pages not a multiple of 64 positions; widths whose query tiles
and two cache blocks overflow shared memory; caches of 2**31 rows or more.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.device import is_hopper, num_sms
from ejkernel.kernels._common.differentiation import differentiated_as
from ejkernel.kernels._common.paged_attention.adapters import latent_batch, latent_options, written
from ejkernel.kernels._common.paged_attention.core_math import max_tiles, span_bound
from ejkernel.kernels._common.paged_attention.jax_core import paged_attention_core
from ejkernel.kernels._common.paged_attention.kv_cache import rope_column
from ejkernel.kernels._common.paged_attention.problem import PagedBatch
from ejkernel.kernels._common.paged_attention.tiles import finish_tiles, prepare_tiles
from ejkernel.kernels._pallas.gpu.flash_attention._tiling import ROWS, SMEM_BYTES
from ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention._kernel import (
    BLOCK,
    MosaicGpuLatentPagedStatic,
    MosaicGpuLatentPagedTiling,
    smem_bytes,
)

WHO = "mosaic gpu multi_latent_ragged_page_attention"
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MAX_LATENT = 512  # a warpgroup's half of the float32 output, [64, L / 2], is one wgmma's N (256) at most
OWN_TILING = {"stages": 2, "shared_scores": True}  # the kernel's own choices besides its splits (`plan`)


def check_servable(queries_nope, queries_pe, kv_cache, kv_cache_scales, tiling: MosaicGpuLatentPagedTiling) -> None:
    """NotImplementedError (one line) for a call the kernel cannot serve, read from shapes and dtypes only."""
    _, heads, latent = queries_nope.shape
    rope = queries_pe.shape[-1]
    dtypes = {jnp.dtype(x.dtype) for x in (queries_nope, queries_pe, kv_cache)}
    if len(dtypes) > 1 or not dtypes <= set(DTYPES):
        names = "/".join(jnp.dtype(x.dtype).name for x in (queries_nope, queries_pe, kv_cache))
        raise NotImplementedError(f"{WHO} takes queries and cache all bfloat16 or all float16, got {names}")
    if kv_cache_scales is not None:
        raise NotImplementedError(f"{WHO} takes no per-row cache scales (quantised caches)")
    if heads % ROWS and ROWS % heads:
        raise NotImplementedError(f"{WHO} takes head counts that are multiples or divisors of {ROWS}, got {heads}")
    if latent % 128 or latent > MAX_LATENT:
        raise NotImplementedError(f"{WHO} takes latent widths in multiples of 128 up to {MAX_LATENT}, got {latent}")
    if rope % 64:
        raise NotImplementedError(f"{WHO} takes RoPE widths in multiples of 64, got {rope}")
    page_size = kv_cache.shape[1] * kv_cache.shape[2]
    if page_size % BLOCK:
        raise NotImplementedError(f"{WHO} takes pages of multiples of {BLOCK} positions, got {page_size}")
    if tiling.stages < 2:
        raise NotImplementedError(f"{WHO} needs stages >= 2 (one block loads while one computes), got {tiling.stages}")
    dims = MosaicGpuLatentPagedStatic(latent, rope, rope_column(latent), heads, page_size, 1, 1.0, None)
    if smem_bytes(dims, tiling, 2) > SMEM_BYTES:
        raise NotImplementedError(
            f"{WHO}: latent {latent} + RoPE {rope} with {tiling} needs {smem_bytes(dims, tiling, 2)} bytes of shared "
            f"memory, over {SMEM_BYTES}"
        )
    if kv_cache.size // kv_cache.shape[-1] >= 2**31:
        raise NotImplementedError(f"{WHO} indexes cache rows in int32: the cache has too many rows")


def plan(batch: PagedBatch, dims: MosaicGpuLatentPagedStatic, chosen: tuple) -> MosaicGpuLatentPagedTiling:
    """The kernel's tiling: the fields `chosen` sets (`(name, value)` pairs), the others its own: 2 stages, the
    shared-scores schedule, and enough splits for every SM (each at least 4 blocks long). Measured on an H200 at
    64 sequences x 8192, 128 heads, 512 + 64 (`exp/s31_mla.py`): shared scores 0.341 ms unsplit, both warpgroups
    scoring 0.431 ms; 2 and 4 splits slower either way."""
    given = dict(chosen)
    if "num_splits" not in given:
        programs = max_tiles(batch.num_tokens, batch.num_seqs, dims.queries) * (dims.tile_rows // ROWS)
        longest = max(1, span_bound(batch.static, dims.queries) // (4 * BLOCK))
        given["num_splits"] = int(max(1, min(32, longest, round(num_sms() / max(programs, 1)))))
    return MosaicGpuLatentPagedTiling(**{**OWN_TILING, **given})


def _forward(dims: MosaicGpuLatentPagedStatic, t: MosaicGpuLatentPagedTiling, batch: PagedBatch) -> jax.Array:
    from ejkernel.kernels._pallas.gpu.multi_latent_ragged_page_attention._kernel import partial_sums

    width = batch.static.head_dim
    tiles, meta, q_tiles, _ = prepare_tiles(batch, dims.queries, dims.tile_rows, width)
    out, lse = partial_sums(dims, t, meta, batch.page_tables, q_tiles.reshape(-1, width), batch.key_rows)
    splits, num_tiles = t.num_splits, meta.shape[0]
    # Each split's rows are normalised: as partial sums they weigh 1 at their log-sum-exp (0 where empty).
    acc = out.astype(jnp.float32).reshape(splits, num_tiles, 1, dims.tile_rows, dims.latent)
    lse = lse.reshape(splits, num_tiles, 1, dims.tile_rows)
    denom = jnp.where(lse == -jnp.inf, 0.0, 1.0)
    return finish_tiles(batch, tiles, dims.queries, acc, lse, denom)[..., : dims.latent]


def _core(latent: int, batch: PagedBatch) -> jax.Array:
    return paged_attention_core(batch)[..., :latent]


@functools.partial(
    jax.jit,
    static_argnames=(
        "softmax_scale", "sliding_window", "logits_soft_cap", "q_scale", "k_scale", "v_scale", "chosen",
    ),
)  # fmt: skip
def _run(*args, chosen, **options):
    batch = latent_batch(*args, **options)
    latent, heads = args[0].shape[-1], args[0].shape[1]
    reference = functools.partial(_core, latent)
    if batch.num_tokens == 0:
        return written(reference(batch).astype(args[0].dtype), batch, args[4])
    st = batch.static
    dims = MosaicGpuLatentPagedStatic(
        latent=latent,
        rope=args[1].shape[-1],
        rope_col=rope_column(latent),
        num_heads=heads,
        page_size=st.rows.page_size,
        num_pages=st.rows.num_pages,
        softmax_scale=st.softmax_scale,
        soft_cap=st.soft_cap,
        queries=max(1, ROWS // heads),
        causal=st.causal,
        window=st.window,
    )
    t = plan(batch, dims, chosen)
    out = differentiated_as(reference, functools.partial(_forward, dims, t))(batch)
    return written(out.astype(args[0].dtype), batch, args[4])


def mosaic_latent_paged(
    queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
    /, *, softmax_scale=None, sliding_window=None, logits_soft_cap=None, mask_value=None, q_scale=None, k_scale=None,
    v_scale=None, kv_cache_scales=None, tiling: MosaicGpuLatentPagedTiling | dict | None = None,
):  # fmt: skip
    """`multi_latent_ragged_page_attention_mosaic_gpu` without the device check (CPU tests lower it for CUDA and
    run it in Mosaic GPU interpret mode). `tiling`: the kernel's splits, stages and schedule, all of them (a
    `MosaicGpuLatentPagedTiling`) or those a dict sets (a config's `mosaic_tiling.overrides()`; the rest `plan`'s)."""
    del mask_value
    given = dataclasses.asdict(tiling) if isinstance(tiling, MosaicGpuLatentPagedTiling) else dict(tiling or {})
    chosen = tuple(sorted(given.items()))
    one_split = MosaicGpuLatentPagedTiling(**{**OWN_TILING, **given, "num_splits": 1})  # splits change no smem
    check_servable(queries_nope, queries_pe, kv_cache, kv_cache_scales, one_split)
    options = latent_options(
        queries_nope, queries_pe, softmax_scale=softmax_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
    args = (queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc)
    return _run(*args, distribution, chosen=chosen, **options)


def multi_latent_ragged_page_attention_mosaic_gpu(*args, cfg=None, **options):
    """`(out [T, Hq, L], updated kv_cache)`: see `ejkernel.modules.multi_latent_ragged_page_attention`.

    Trusts its arguments (the public functions check them): `keys_values [T, L]`, `keys_pe [T, R]`,
    `block_tables` 1-D. Of `cfg` (either MLA config) only `mosaic_tiling` counts: the fields it sets, the others
    the kernel's own (`plan`). Declines (NotImplementedError) off a Hopper GPU and what `check_servable` names.
    """
    tiling = getattr(cfg, "mosaic_tiling", None)
    if tiling is not None:
        options["tiling"] = tiling.overrides()
    if not is_hopper():
        device = jax.devices()[0]
        raise NotImplementedError(f"{WHO} needs a Hopper GPU (compute capability 9.x), not {device.device_kind}")
    return mosaic_latent_paged(*args, **options)
