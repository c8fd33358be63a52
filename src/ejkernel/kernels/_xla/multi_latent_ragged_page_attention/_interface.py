"""MLA serving in plain JAX: the new latent rows are scattered into the packed cache, then the shared paged core
runs multi-query attention over each sequence's pages.

A cache row `[c (L), 0…, r (R), 0…]` is both the key (scored against the query `[q_nope, 0…, q_pe, 0…]`)
and, through its first `L` columns, the value: MLA is MQA with one shared latent head whose head dim is
the padded row. The cache `[pages, rows, packing, width]` viewed as `[pages * page_size, width]` holds
position `i` of page `g` at row `g * page_size + i` (packing only folds the slot axis), so the core's
addressing reads it directly. Only the rows of the new tokens are written (a scatter: under donation,
in place), and the core counts only positions below each `kv_len` (a step's gather of a whole chunk is
clamped to the cache and masked past it), so entries of a block table past the pages covering
`kv_len` are never written and whatever they hold never changes the result. Index values follow the
shared rules of `ejkernel.kernels._common.paged_attention` (lengths and bounds clamped, positions on
pages outside the cache masked and not written).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.paged_attention.adapters import clamp_lengths, ragged_queries
from ejkernel.kernels._common.paged_attention.arguments import last_positions_window
from ejkernel.kernels._common.paged_attention.jax_core import default_block_q, paged_attention_core
from ejkernel.kernels._common.paged_attention.kv_cache import new_token_rows, quantize_queries
from ejkernel.kernels._common.paged_attention.problem import CacheRows, PagedBatch, PagedStatic
from ejkernel.ops.config import FwdParams, KernelConfig


def _align128(n: int) -> int:
    return -(-n // 128) * 128


def _pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


def _mixed(value):
    """A block size of either MLA config: an int, None, or v2's `(decode, prefill, mixed)`, whose mixed entry
    the XLA path uses (one program serves every mix)."""
    return value[2] if isinstance(value, tuple) else value


def write_latents(kv_cache, keys_values, keys_pe, kv_lens, tables, query_start, query_len) -> jax.Array:
    """The cache with every processed token's `[c, 0…, r, 0…]` at its row of `new_token_rows` (cast to the
    cache dtype): token `query_start[s] + j` at position `kv_lens[s] - query_len[s] + j` of sequence s."""
    num_pages, rows, packing, width = kv_cache.shape
    page_size = rows * packing
    num_tokens, latent = keys_values.shape
    row = new_token_rows(tables, kv_lens, query_start, query_len, num_tokens, page_size, num_pages)
    rope_col = _align128(latent)
    new = jnp.zeros((num_tokens, width), kv_cache.dtype)
    new = new.at[:, :latent].set(keys_values.astype(kv_cache.dtype))
    new = new.at[:, rope_col : rope_col + keys_pe.shape[1]].set(keys_pe.astype(kv_cache.dtype))
    flat = kv_cache.reshape(num_pages * page_size, width)
    return flat.at[row].set(new, mode="drop", unique_indices=True).reshape(kv_cache.shape)


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
def _run(
    queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution, *,
    softmax_scale, sliding_window, logits_soft_cap, q_scale, k_scale, v_scale, cfg,
):  # fmt: skip
    num_tokens, num_heads, latent = queries_nope.shape
    rope = queries_pe.shape[-1]
    num_pages, rows, packing, width = kv_cache.shape
    page_size = rows * packing
    num_seqs = kv_lens.shape[0]
    tables = block_tables.astype(jnp.int32).reshape(num_seqs, -1)
    kv_lens = clamp_lengths(kv_lens, tables.shape[1] * page_size)
    query_start, query_len = ragged_queries(query_start_loc, distribution[2], num_seqs, num_tokens)
    kv_cache = write_latents(kv_cache, keys_values, keys_pe, kv_lens, tables, query_start, query_len)

    compute = jnp.promote_types(jnp.promote_types(queries_nope.dtype, queries_pe.dtype), kv_cache.dtype)
    rope_col = _align128(latent)
    queries = jnp.zeros((num_tokens, num_heads, width), compute)
    queries = queries.at[..., :latent].set(queries_nope.astype(compute))
    queries = queries.at[..., rope_col : rope_col + rope].set(queries_pe.astype(compute))
    scale = softmax_scale
    if q_scale is not None:
        queries = quantize_queries(queries, q_scale, kv_cache.dtype)
        scale *= q_scale
    if k_scale is not None:
        scale *= k_scale
    rows_view = kv_cache.reshape(num_pages * page_size, width)
    batch = PagedBatch(
        queries=queries,
        key_rows=rows_view,
        value_rows=rows_view,
        page_tables=tables,
        query_start=query_start,
        query_len=query_len,
        kv_len=kv_lens,
        static=PagedStatic(
            rows=CacheRows(page_size, num_pages, page_size, 1, 1),
            num_kv_heads=1,
            head_dim=width,
            softmax_scale=scale,
            soft_cap=None if logits_soft_cap is None else abs(logits_soft_cap),
            window=last_positions_window(sliding_window),
            value_scale=v_scale,
            max_kv_len=tables.shape[1] * page_size,
        ),
    )
    out = paged_attention_core(batch, _core_cfg(cfg, batch, page_size))
    return out[..., :latent].astype(queries_nope.dtype), kv_cache


def multi_latent_ragged_page_attention_xla(
    queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
    /, *, softmax_scale=None, sliding_window=None, logits_soft_cap=None, mask_value=None, q_scale=None, k_scale=None,
    v_scale=None, cfg=None,
):  # fmt: skip
    """`(out [T, Hq, L], updated kv_cache)`: see `ejkernel.modules.multi_latent_ragged_page_attention`.

    Trusts its arguments (the public functions check them): `keys_values [T, L]`, `keys_pe [T, R]`,
    `block_tables` 1-D. `mask_value` is accepted and unused (masked positions are excluded exactly);
    of `cfg` (either MLA config) only the block sizes count.
    """
    del mask_value
    if softmax_scale is None:
        softmax_scale = (queries_nope.shape[-1] + queries_pe.shape[-1]) ** -0.5
    floats = lambda x: None if x is None else float(x)
    window = None if sliding_window is None else int(sliding_window)
    return _run(
        queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution,
        softmax_scale=float(softmax_scale), sliding_window=window, logits_soft_cap=floats(logits_soft_cap),
        q_scale=floats(q_scale), k_scale=floats(k_scale), v_scale=floats(v_scale), cfg=cfg,
    )  # fmt: skip
