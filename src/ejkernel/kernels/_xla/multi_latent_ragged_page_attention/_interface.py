"""MLA serving in plain JAX: the new latent rows are scattered into the packed cache, then the shared paged core
runs multi-query attention over each sequence's pages.

`_common.paged_attention.adapters.latent_batch` writes the rows and states the problem: a cache row
`[c (L), 0…, r (R), 0…]` is both the key (scored against the query `[q_nope, 0…, q_pe, 0…]`) and, through its
first `L` columns, the value: MLA is MQA with one shared latent head whose head dim is the padded row. Only
the rows of the new tokens are written (a scatter: under donation, in place), and the core counts only
positions below each `kv_len` (a step's gather of a whole chunk is clamped to the cache and masked past it),
so entries of a block table past the pages covering `kv_len` are never written and whatever they hold never
changes the result. Index values follow the shared rules of `ejkernel.kernels._common.paged_attention`
(lengths and bounds clamped, positions on pages outside the cache masked and not written).
"""

from __future__ import annotations

import functools

import jax

from ejkernel.kernels._common.paged_attention.adapters import latent_batch, latent_options, written
from ejkernel.kernels._common.paged_attention.jax_core import default_block_q, paged_attention_core
from ejkernel.kernels._common.paged_attention.problem import PagedBatch
from ejkernel.ops.config import FwdParams, KernelConfig


def _pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


def _mixed(value):
    """A block size of either MLA config: an int, None, or v2's `(decode, prefill, mixed)`, whose mixed entry
    the XLA path uses (one program serves every mix)."""
    return value[2] if isinstance(value, tuple) else value


def _core_cfg(cfg, batch: PagedBatch, page_size: int) -> KernelConfig:
    """The core's tiling from an MLA config: at most `num_queries_per_block` queries per tile (fewer when the
    sequences average fewer, so decode tiles are not padded to it), about `num_kv_pages_per_block` pages of
    positions per step; powers of two, as the core's tiles are. Unset fields: the core's defaults."""
    queries = _mixed(getattr(cfg, "num_queries_per_block", None))
    pages = _mixed(getattr(cfg, "num_kv_pages_per_block", None))
    block_q = None if queries is None else _pow2_floor(min(queries, default_block_q(batch)))
    block_k = None if pages is None else _pow2_floor(pages * page_size)
    return KernelConfig(fwd_params=FwdParams(block_q=block_q, block_k=block_k))


@functools.partial(
    jax.jit,
    static_argnames=("softmax_scale", "sliding_window", "logits_soft_cap", "q_scale", "k_scale", "v_scale", "cfg"),
)
def _run(*args, cfg, **options):
    batch = latent_batch(*args, **options)
    out = paged_attention_core(batch, _core_cfg(cfg, batch, batch.static.rows.page_size))
    return written(out[..., : args[0].shape[-1]].astype(args[0].dtype), batch, args[4])


def multi_latent_ragged_page_attention_xla(
    queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
    /, *, softmax_scale=None, sliding_window=None, logits_soft_cap=None, mask_value=None, q_scale=None, k_scale=None,
    v_scale=None, kv_cache_scales=None, cfg=None,
):  # fmt: skip
    """`(out [T, Hq, L], updated kv_cache)` (and the updated `kv_cache_scales` with them): see
    `ejkernel.modules.multi_latent_ragged_page_attention`.

    Trusts its arguments (the public functions check them): `keys_values [T, L]`, `keys_pe [T, R]`,
    `block_tables` 1-D. `mask_value` is accepted and unused (masked positions are excluded exactly);
    of `cfg` (either MLA config) only the block sizes count.
    """
    del mask_value
    options = latent_options(
        queries_nope, queries_pe, softmax_scale=softmax_scale, sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
    return _run(
        queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
        cfg=cfg, kv_cache_scales=kv_cache_scales, **options,
    )  # fmt: skip
