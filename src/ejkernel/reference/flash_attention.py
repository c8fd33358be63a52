"""Reference flash attention: the dense float32 definition that every backend is tested against."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ejkernel.reference.dropout import dropout_keep


def flash_attention_reference(
    query,
    key,
    value,
    bias=None,
    softmax_aux=None,
    *,
    q_segment_ids=None,
    kv_segment_ids=None,
    attention_mask=None,
    softmax_scale: float,
    causal: bool = False,
    sliding_window: tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    dropout_prob: float = 0.0,
    dropout_seed=None,
    fwd_params=None,
    bwd_params=None,
    return_lse: bool = False,
):
    """Dense multi-head attention with every masking option, computed in float32.

    Shapes: query [B, Sq, H, D]; key [B, Sk, Hkv, D]; value [B, Sk, Hkv, Dv] with H % Hkv == 0
    (query head h reads key/value head h // (H // Hkv)); bias [Bb, Hb, Sq, Sk] additive
    (Bb in {1, B}, Hb in {1, H}); softmax_aux 1-D sink logits; q_segment_ids [B, Sq] and
    kv_segment_ids [B, Sk] int (both or neither); attention_mask bool [Bm, Hm, Sq, Sk]
    (True = may attend). Returns [B, Sq, H, Dv] in query.dtype. `fwd_params`/`bwd_params` are
    accepted and ignored.

    For batch b, query head h (key/value head g), query position i, key position j (plain
    indices, top-left aligned):

    1. s_ij = softmax_scale * <q[b,i,h], k[b,j,g]> in float32.
    2. Soft cap c: s_ij = c * tanh(s_ij / c).
    3. Bias: s_ij += bias[b or 0, h or 0, i, j].
    4. allowed(i, j) is the conjunction of: (not causal or j <= i); (no window, or
       i - left <= j <= i + right); (segments: q_seg[b,i] >= 0, kv_seg[b,j] >= 0 and
       q_seg[b,i] == kv_seg[b,j]); (attention_mask[b or 0, h or 0, i, j]).
    5. Softmax over the allowed j, with sink logits joining the denominator only (they are not
       scaled, capped or biased). Sinks of head h: [aux[h]] if len(aux) == H, else all of aux.
       m_i = max(max_{allowed j} s_ij, max sinks); l_i = sum_{allowed j} exp(s_ij - m_i)
       + sum_sinks exp(aux - m_i); p_ij = exp(s_ij - m_i) / l_i if allowed, else 0.
    6. Dropout with rate r > 0: p_ij *= keep_ij / (1 - r), keep_ij =
       dropout_keep(dropout_seed, b * H + h, i, j, r).
    7. out[b,i,h] = sum_j p_ij v[b,j,g]. A row with no allowed key is exactly 0 (with or without
       sinks) and contributes nothing to any gradient.
    8. With `return_lse`, also lse[b,i,h] = m_i + log l_i float32 [B, Sq, H], the natural log of the
       softmax denominator (sinks included, dropout not); -inf where l_i is 0 (no key, no sink).

    Gradients come from JAX autodiff of this function; guards (`jnp.where`, never `-inf`
    arithmetic on differentiated values) keep them finite for fully masked rows.
    """
    out_dtype = query.dtype
    q = jnp.asarray(query, jnp.float32)
    k = jnp.asarray(key, jnp.float32)
    v = jnp.asarray(value, jnp.float32)
    batch, q_len, num_heads, _ = q.shape
    k_len, num_kv_heads = k.shape[1], k.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of key/value heads ({num_kv_heads})")
    group = num_heads // num_kv_heads

    # Each query head reads its key/value head (repeating is fine here: this is the dense oracle).
    kv_head = jnp.arange(num_heads) // group
    k_per_head = k[:, :, kv_head]  # [B, Sk, H, D]
    v_per_head = v[:, :, kv_head]  # [B, Sk, H, Dv]

    # 1. Scaled dot products, [B, H, Sq, Sk].
    s = jnp.einsum("bihd,bjhd->bhij", q, k_per_head, precision=jax.lax.Precision.HIGHEST) * softmax_scale

    # 2. Soft cap.
    if logits_soft_cap is not None:
        s = logits_soft_cap * jnp.tanh(s / logits_soft_cap)

    # 3. Additive bias.
    if bias is not None:
        s = s + jnp.asarray(bias, jnp.float32)

    # 4. Which keys each query may attend to.
    i = jnp.arange(q_len)[:, None]
    j = jnp.arange(k_len)[None, :]
    allowed = jnp.ones((1, 1, q_len, k_len), bool)
    if causal:
        allowed = allowed & (j <= i)
    if sliding_window is not None:
        left, right = sliding_window
        allowed = allowed & (j >= i - left) & (j <= i + right)
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids and kv_segment_ids must be given together")
    if q_segment_ids is not None:
        qs = jnp.asarray(q_segment_ids)[:, None, :, None]
        ks = jnp.asarray(kv_segment_ids)[:, None, None, :]
        allowed = allowed & (qs >= 0) & (ks >= 0) & (qs == ks)
    if attention_mask is not None:
        allowed = allowed & jnp.asarray(attention_mask, bool)
    allowed = jnp.broadcast_to(allowed, s.shape)

    # 5. Softmax over allowed keys, sinks in the denominator only.
    row_max = jnp.max(jnp.where(allowed, s, -jnp.inf), axis=-1)  # [B, H, Sq]; -inf for empty rows
    if softmax_aux is not None:
        aux = jnp.asarray(softmax_aux, jnp.float32)
        sinks = aux[:, None] if aux.shape[0] == num_heads else jnp.broadcast_to(aux, (num_heads, aux.shape[0]))
        sinks = sinks[None, :, None, :]  # [1, H, 1, n]
        row_max = jnp.maximum(row_max, jnp.max(sinks, axis=-1))
    # The shift cancels in the softmax; stopping its gradient keeps autodiff away from the max.
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))[..., None]
    e = jnp.exp(jnp.where(allowed, s - m, -jnp.inf))  # 0 where not allowed
    denom = jnp.sum(e, axis=-1, keepdims=True)
    if softmax_aux is not None:
        denom = denom + jnp.sum(jnp.exp(sinks - m), axis=-1, keepdims=True)
    p = e / jnp.where(denom > 0, denom, 1.0)

    # 6. Dropout.
    if dropout_prob > 0.0:
        if dropout_seed is None:
            raise ValueError("dropout_prob > 0 needs a dropout_seed")
        b_idx = jnp.arange(batch)[:, None, None, None]
        h_idx = jnp.arange(num_heads)[None, :, None, None]
        keep = dropout_keep(dropout_seed, b_idx * num_heads + h_idx, i[None, None], j[None, None], dropout_prob)
        p = jnp.where(keep, p / (1.0 - dropout_prob), 0.0)

    # 7. Weighted sum of values.
    out = jnp.einsum("bhij,bjhd->bihd", p, v_per_head, precision=jax.lax.Precision.HIGHEST)
    if not return_lse:
        return out.astype(out_dtype)
    # 8. The log of the denominator.
    total, shift = denom[..., 0], m[..., 0]
    lse = jnp.where(total > 0, shift + jnp.log(jnp.where(total > 0, total, 1.0)), -jnp.inf)
    return out.astype(out_dtype), jnp.swapaxes(lse, 1, 2)


def dequantized_flash_attention_reference(
    query, key, value, bias=None, softmax_aux=None, *, q_descale=None, k_descale=None, v_descale=None, **options
):
    """float8 flash attention: `flash_attention_reference` (float32) of the dequantised inputs, as bfloat16.

    Each of query, key and value stands for `code * descale`, the descale a scalar or one factor per head of
    that tensor (`[H]` for the query, `[Hkv]` for key and value); None means 1. `options` are those of
    `flash_attention_reference`.
    """

    def dequantized(x, descale):
        x = jnp.asarray(x).astype(jnp.float32)
        if descale is None:
            return x
        return x * jnp.broadcast_to(jnp.asarray(descale, jnp.float32), (x.shape[2],))[:, None]

    q, k, v = (dequantized(x, d) for x, d in ((query, q_descale), (key, k_descale), (value, v_descale)))
    result = flash_attention_reference(q, k, v, bias, softmax_aux, **options)
    if options.get("return_lse"):
        return result[0].astype(jnp.bfloat16), result[1]
    return result.astype(jnp.bfloat16)
