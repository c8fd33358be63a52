"""Reference attention of decode queries over a shared prefix followed by each sequence's own paged keys."""

import jax
import jax.numpy as jnp
import numpy as np


def _own(cache, pages, length):
    """The first `length` tokens of `cache [pages, Hkv, page_size, D]`'s `pages`, in order: `[length, Hkv, D]`."""
    return jnp.swapaxes(cache[pages], 1, 2).reshape(-1, *cache.shape[1::2])[:length]


def cascade_attention_reference(
    query, prefix_key, prefix_value, key_cache, value_cache, context_lens, block_tables, *, softmax_scale,
    logits_soft_cap=None, softmax_aux=None,
):  # fmt: skip
    """`[N, H, D]` float32: sequence i's query over the keys `prefix ++ its first context_lens[i] cached tokens`.

    query [N, H, D]; prefix_key / prefix_value [P, Hkv, D]; caches [pages, Hkv, page_size, D] with
    `block_tables [N, max_blocks]` listing each sequence's pages in order. Logits are `softmax_scale · q·k`,
    soft-capped `c · tanh(s / c)` when `logits_soft_cap` is given; sinks (`softmax_aux [H]`) join the
    denominator only. Query head h reads key/value head `h // (H // Hkv)`. One sequence at a time, densely.
    """
    q = jnp.asarray(query, jnp.float32)
    num_heads, group = q.shape[1], q.shape[1] // prefix_key.shape[1]
    page = key_cache.shape[2]
    outs = []
    for i, length in enumerate(np.asarray(context_lens)):
        pages = np.asarray(block_tables[i, : -(-int(length) // page)])
        k = jnp.concatenate([prefix_key, _own(key_cache, pages, length)]).astype(jnp.float32)  # [L, Hkv, D]
        v = jnp.concatenate([prefix_value, _own(value_cache, pages, length)]).astype(jnp.float32)
        k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
        s = jnp.einsum("hd,lhd->hl", q[i], k, precision=jax.lax.Precision.HIGHEST) * softmax_scale
        if logits_soft_cap is not None:
            s = logits_soft_cap * jnp.tanh(s / logits_soft_cap)
        if softmax_aux is not None:
            s = jnp.concatenate([s, jnp.asarray(softmax_aux, jnp.float32)[:, None]], axis=1)
            v = jnp.concatenate([v, jnp.zeros((1, num_heads, v.shape[-1]))])
        outs.append(jnp.einsum("hl,lhd->hd", jax.nn.softmax(s, axis=-1), v, precision=jax.lax.Precision.HIGHEST))
    return jnp.stack(outs)
