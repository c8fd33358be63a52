"""Reference block-sparse attention: dense masked attention in float32, heads before the sequence."""

from __future__ import annotations

import jax.numpy as jnp

from ejkernel.reference.flash_attention import flash_attention_reference


def blocksparse_attention_reference(
    query,
    key,
    value,
    softmax_aux=None,
    bias=None,
    *,
    q_segment_ids=None,
    kv_segment_ids=None,
    attention_mask=None,
    causal: bool = True,
    sliding_window: tuple[int, int] | None = None,
    chunk_size: int | None = None,
    softmax_scale: float | None = None,
    logits_soft_cap: float | None = None,
):
    """Softmax attention of query [B, H, Sq, D] over key [B, Hkv, Sk, D] / value [B, Hkv, Sk, Dv].

    Returns [B, H, Sq, Dv] in query.dtype. Query `i` may attend key `j` (positions counted from the
    start of both sequences) where all of these allow it: `causal` (`j <= i`), `sliding_window`
    `(left, right)` (`i - left <= j <= i + right`), `chunk_size c` (`i // c == j // c`), segment ids
    (`q_segment_ids[b, i] == kv_segment_ids[b, j] >= 0`) and `attention_mask [1|B, 1|H, Sq, Sk]`.
    Everything else is `flash_attention_reference` (soft cap, then bias, then the softmax with sink
    logits `softmax_aux` in the denominator; a row with no allowed key is 0), whose layout is
    `[B, S, H, D]`. The default scale is `D ** -0.5`.
    """
    q_len, kv_len = query.shape[2], key.shape[2]
    i = jnp.arange(q_len)[:, None]
    j = jnp.arange(kv_len)[None, :]
    allowed = jnp.ones((q_len, kv_len), bool)
    if chunk_size is not None:
        allowed = allowed & (i // chunk_size == j // chunk_size)
    allowed = allowed[None, None]
    if attention_mask is not None:
        allowed = allowed & jnp.asarray(attention_mask, bool)
    out = flash_attention_reference(
        jnp.swapaxes(query, 1, 2),
        jnp.swapaxes(key, 1, 2),
        jnp.swapaxes(value, 1, 2),
        bias,
        softmax_aux,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
        attention_mask=allowed,
        softmax_scale=query.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale,
        causal=causal,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
    )
    return jnp.swapaxes(out, 1, 2)
