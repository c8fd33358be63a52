"""Cascade attention on any paged core: the shared prefix read once for the whole batch, each sequence's own
pages apart, the two partial results joined by their log-sum-exps.

The prefix pass is one more `PagedBatch`: a single sequence whose queries are the batch's decode queries,
attending without a causal mask to the prefix's `[prefix_len, Hkv, D]` keys, viewed as one page of
`prefix_len` slots (no copy). A paged core reads each key row once per tile of queries, so the prefix's
keys and values cross memory once per tile (two tiles for 64 queries of 4 grouped heads), not once per
sequence. The own pass is `page_attention`'s decode batch. Both give `(out, lse)` (`finalize`); sinks join
the prefix pass only, so they count once.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ejkernel.kernels._common.attention import fold_sinks
from ejkernel.kernels._common.attention_states import merge_states
from ejkernel.kernels._common.paged_attention.adapters import page_attention_batch
from ejkernel.kernels._common.paged_attention.problem import CacheRows, PagedBatch, PagedStatic


def prefix_batch(query, prefix_key, prefix_value, sinks, own: PagedStatic) -> PagedBatch:
    """The batch's `N` queries as one sequence over the whole prefix (non-causal), options as `own`'s."""
    num_seqs, _, head_dim = query.shape
    prefix_len, num_kv_heads, _ = prefix_key.shape
    rows = CacheRows(prefix_len, 1, prefix_len * num_kv_heads, num_kv_heads, 1)
    return PagedBatch(
        queries=query,
        key_rows=prefix_key.reshape(-1, head_dim),
        value_rows=prefix_value.reshape(-1, head_dim),
        page_tables=jnp.zeros((1, 1), jnp.int32),
        query_start=jnp.zeros((1,), jnp.int32),
        query_len=jnp.full((1,), num_seqs, jnp.int32),
        kv_len=jnp.full((1,), prefix_len, jnp.int32),
        sinks=sinks,
        static=dataclasses.replace(own, rows=rows, causal=False, max_kv_len=prefix_len, num_splits=0),
    )


def cascade_attention_on(
    core, query, prefix_key, prefix_value, key_cache, value_cache, context_lens, block_tables, softmax_aux=None,
    *, softmax_scale: float, logits_soft_cap: float | None = None,
):  # fmt: skip
    """`cascade_attention` (arguments canonical, as the public op passes them) through a paged `core(batch,
    with_lse=True) -> (out [T, Hq, D], lse [T, Hq])`: `[N, H, D]` in query's dtype."""
    own = page_attention_batch(
        query, key_cache, value_cache, context_lens, block_tables,
        attn_scale=softmax_scale, attn_logits_soft_cap=logits_soft_cap,
    )  # fmt: skip
    sinks = fold_sinks(softmax_aux, query.shape[1])
    if prefix_key.shape[0] == 0:
        return core(dataclasses.replace(own, sinks=sinks), with_lse=True)[0]
    shared, shared_lse = core(prefix_batch(query, prefix_key, prefix_value, sinks, own.static), with_lse=True)
    mine, mine_lse = core(own, with_lse=True)
    return merge_states(shared, shared_lse, mine, mine_lse)[0].astype(query.dtype)
