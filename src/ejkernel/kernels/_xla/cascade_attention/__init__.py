"""Cascade attention in XLA: the shared prefix once for the whole batch, each sequence's own pages apart, and
the two partial results merged by their log-sum-exps."""

import jax.numpy as jnp

from ejkernel.kernels._common.attention_call import AttentionCall
from ejkernel.kernels._common.attention_states import merge_states
from ejkernel.kernels._common.flash_attention.entry import flash_attention_xla


def cascade_attention_xla(
    query, prefix_key, prefix_value, key_cache, value_cache, context_lens, block_tables, softmax_aux=None, *,
    softmax_scale: float, logits_soft_cap: float | None = None, cfg=None,
):  # fmt: skip
    """`[N, H, D]` in query's dtype; arguments as `ejkernel.modules.cascade_attention`'s, canonical.

    The prefix pass reads the prefix's keys and values once: the N decode queries are the rows of one
    sequence attending to all of it (sinks join here). The own pass gathers each sequence's pages into a
    dense row, its tokens past `context_lens` masked by segment ids.
    """
    shared, shared_lse = flash_attention_xla(
        query[None], prefix_key[None], prefix_value[None], None, softmax_aux,
        AttentionCall(softmax_scale=softmax_scale, logits_soft_cap=logits_soft_cap), return_lse=True,
    )  # fmt: skip
    num_seqs, max_blocks = block_tables.shape
    pages = jnp.clip(block_tables, 0, key_cache.shape[0] - 1)
    rows = lambda cache: jnp.swapaxes(cache[pages], 2, 3).reshape(num_seqs, -1, *cache.shape[1::2])
    positions = jnp.arange(max_blocks * key_cache.shape[2], dtype=jnp.int32)
    own_keys = jnp.where(positions[None] < context_lens[:, None], 0, -1)
    call = AttentionCall(
        softmax_scale=softmax_scale,
        logits_soft_cap=logits_soft_cap,
        q_segment_ids=jnp.zeros((num_seqs, 1), jnp.int32),
        kv_segment_ids=own_keys,
    )
    own, own_lse = flash_attention_xla(
        query[:, None], rows(key_cache), rows(value_cache), None, None, call, return_lse=True
    )
    out, _ = merge_states(shared[0], shared_lse[0], own[:, 0], own_lse[:, 0])
    return out.astype(query.dtype)


__all__ = ["cascade_attention_xla"]
