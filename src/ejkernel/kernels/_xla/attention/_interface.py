"""Dense attention that also returns the attention weights (for inspection and small models).

It materialises the `[B, H, Sq, Sk]` weights by design; use `flash_attention` when they are not needed.
"""

import jax
import jax.numpy as jnp


def attention_xla(
    query,
    key,
    value,
    bias=None,
    dropout_rng=None,
    softmax_aux=None,
    *,
    attention_mask=None,
    softmax_scale: float,
    logits_soft_cap=None,
    dtype=jnp.bfloat16,
    softmax_dtype=None,
    dropout_prob: float = 0.0,
    deterministic: bool = True,
    causal: bool = False,
    sliding_window=None,
    cfg=None,
):
    """`(out [B, Sq, H, Dv], weights [B, H, Sq, Sk])`; `attention_mask` is a dense bool [B|1, H|1, Sq, Sk]."""
    batch, q_len, num_heads, _ = query.shape
    kv_len, kv_heads = key.shape[1], key.shape[2]
    group = num_heads // kv_heads
    softmax_dtype = jnp.dtype(softmax_dtype or jnp.float32)
    q = query.reshape(batch, q_len, kv_heads, group, query.shape[-1])
    logits = jnp.einsum("bqhgd,bkhd->bhgqk", q, key, preferred_element_type=jnp.float32).astype(softmax_dtype)
    logits = logits.reshape(batch, num_heads, q_len, kv_len) * softmax_scale
    if logits_soft_cap is not None:
        logits = logits_soft_cap * jnp.tanh(logits / logits_soft_cap)
    if bias is not None:
        logits = logits + bias.astype(softmax_dtype)
    allowed = jnp.ones((1, 1, q_len, kv_len), bool)
    rows, cols = jnp.arange(q_len)[:, None], jnp.arange(kv_len)[None, :]
    if causal:
        allowed &= cols <= rows
    if sliding_window is not None:
        allowed &= (cols >= rows - sliding_window[0]) & (cols <= rows + sliding_window[1])
    if attention_mask is not None:
        allowed = allowed & attention_mask
    masked = jnp.where(allowed, logits, -jnp.inf)
    row_max = jnp.max(masked, axis=-1, keepdims=True, initial=-jnp.inf)  # no keys (Sk = 0): -inf, then zeros
    if softmax_aux is not None:
        sinks = softmax_aux.astype(softmax_dtype)
        sinks = sinks[None, :, None, None] if sinks.shape[0] == num_heads else sinks[None, None, None, :]
        row_max = jnp.maximum(row_max, jnp.max(sinks, axis=-1, keepdims=True))
    row_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
    exp = jnp.where(allowed, jnp.exp(masked - row_max), 0.0)
    denominator = jnp.sum(exp, axis=-1, keepdims=True)
    if softmax_aux is not None:
        denominator = denominator + jnp.sum(jnp.exp(sinks - row_max), axis=-1, keepdims=True)
    weights = exp / jnp.where(denominator > 0, denominator, 1.0)
    if dropout_prob > 0.0 and not deterministic:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_prob, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_prob), 0.0)
    weights = weights.astype(dtype)
    grouped = weights.reshape(batch, kv_heads, group, q_len, kv_len)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", grouped, value.astype(dtype), preferred_element_type=jnp.float32)
    return out.reshape(batch, q_len, num_heads, value.shape[-1]).astype(dtype), weights
