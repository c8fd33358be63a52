"""Reference multi-head latent attention: keys and values decompressed per head, then dense float32 attention.

Written out in plain JAX on purpose (no package helpers): it is the definition the implementations are
tested against, so it shares nothing with them but the dropout hash of `reference/dropout.py`, which every
implementation reproduces.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.reference.dropout import dropout_keep


def flash_mla_reference(
    query,
    key_value,
    w_kc,
    w_vc,
    b_q=None,
    b_k=None,
    cu_seqlens=None,
    *,
    softmax_scale=None,
    causal=False,
    attention_mask=None,
    bias=None,
    softmax_aux=None,
    logits_soft_cap=None,
    deterministic=True,
    dropout_rng=None,
    dropout_prob=0.0,
    sliding_window=None,
    softmax_dtype=None,
):
    """`[B, Sq, Hq, Dv]`: attention over keys and values decompressed from the latent `key_value`.

    Shapes: query [B, Sq, Hq, Dq]; key_value [B, Sk, rank]; w_kc [rank, Hkv, d_nope]; w_vc [rank, Hkv, Dv];
    query head h reads key/value head g = h // (Hq / Hkv). In float32:

    1. k_nope[b, j, g] = key_value[b, j] @ w_kc[:, g];   v[b, j, g] = key_value[b, j] @ w_vc[:, g].
    2. RoPE mode: no b_k: q = query, k = k_nope. Only b_k: query is [nope | rope] (Dq = d_nope + d_rope),
       k = [k_nope | b_k[b, j]]. Both: q = [query | b_q[b, i] (per head if 4-D)], k = [k_nope | b_k[b, j]].
    3. s_ij = softmax_scale * <q_i, k_j> (default scale 1/sqrt(d_nope + d_rope)); soft cap
       c * tanh(s / c); + bias [1|B, 1|Hq, Sq, Sk].
    4. Key j is allowed for query i (top-left aligned positions) if: not causal or j <= i; no window or
       i - left <= j <= i + right (an int w is (w, w)); attention_mask [1|B, 1|Hq, Sq, Sk] is nonzero; and,
       with `cu_seqlens [N+1]` (sequences packed along the sequence axis of every batch row), i and j lie
       in the same sequence (positions past cu[N] are padding: zero output).
    5. Softmax over the allowed keys, the sinks `softmax_aux` (one per head, or all of them for every head)
       joining the denominator only; a row with no allowed key is 0.
    6. Dropout (dropout_prob = r > 0, deterministic=False): p_ij kept with probability 1 - r and scaled by
       1 / (1 - r), by the package's counter-based mask under a seed drawn from dropout_rng.
    7. out = sum_j p_ij v_j, in query's dtype (`softmax_dtype` is accepted: the softmax is float32).
    """
    del softmax_dtype
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    highest = jax.lax.Precision.HIGHEST
    batch, q_len, num_heads, _ = query.shape
    kv_len, num_kv_heads, nope_dim = key_value.shape[1], w_kc.shape[1], w_kc.shape[2]
    rope_dim = 0 if b_k is None else b_k.shape[2]

    # 1-2. Per-head keys and values, RoPE dims appended; each query head reads its key/value head.
    k = jnp.einsum("bjr,rgd->bjgd", f32(key_value), f32(w_kc), precision=highest)
    v = jnp.einsum("bjr,rgd->bjgd", f32(key_value), f32(w_vc), precision=highest)
    q = f32(query)
    if b_k is not None:
        k = jnp.concatenate([k, jnp.broadcast_to(f32(b_k)[:, :, None], (*k.shape[:3], rope_dim))], axis=-1)
    if b_q is not None:
        rope = f32(b_q) if b_q.ndim == 4 else jnp.broadcast_to(f32(b_q)[:, :, None], (*q.shape[:3], rope_dim))
        q = jnp.concatenate([q, rope], axis=-1)
    kv_head = jnp.arange(num_heads) // (num_heads // num_kv_heads)
    k, v = k[:, :, kv_head], v[:, :, kv_head]

    # 3. Scores [B, Hq, Sq, Sk].
    scale = (nope_dim + rope_dim) ** -0.5 if softmax_scale is None else softmax_scale
    s = jnp.einsum("bihd,bjhd->bhij", q, k, precision=highest) * scale
    if logits_soft_cap is not None:
        s = logits_soft_cap * jnp.tanh(s / logits_soft_cap)
    if bias is not None:
        s = s + f32(bias)

    # 4. The allowed keys.
    i = jnp.arange(q_len)[:, None]
    j = jnp.arange(kv_len)[None, :]
    allowed = jnp.ones((1, 1, q_len, kv_len), bool)
    if causal:
        allowed = allowed & (j <= i)
    if sliding_window is not None:
        left, right = (sliding_window, sliding_window) if np.ndim(sliding_window) == 0 else sliding_window
        allowed = allowed & (j >= i - left) & (j <= i + right)
    if attention_mask is not None:
        allowed = allowed & (jnp.asarray(attention_mask) != 0)
    if cu_seqlens is not None:
        bounds = jnp.asarray(cu_seqlens)
        positions = jnp.arange(q_len)
        segment = jnp.where(positions < bounds[-1], jnp.searchsorted(bounds[1:], positions, side="right"), -1)
        allowed = allowed & (segment[:, None] >= 0) & (segment[:, None] == segment[None, :])
    allowed = jnp.broadcast_to(allowed, s.shape)

    # 5. Softmax over the allowed keys, sinks in the denominator only.
    row_max = jnp.max(jnp.where(allowed, s, -jnp.inf), axis=-1)
    if softmax_aux is not None:
        aux = f32(softmax_aux)
        sinks = aux[:, None] if aux.shape[0] == num_heads else jnp.broadcast_to(aux, (num_heads, aux.shape[0]))
        sinks = sinks[None, :, None, :]
        row_max = jnp.maximum(row_max, jnp.max(sinks, axis=-1))
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))[..., None]
    e = jnp.exp(jnp.where(allowed, s - m, -jnp.inf))
    denom = jnp.sum(e, axis=-1, keepdims=True)
    if softmax_aux is not None:
        denom = denom + jnp.sum(jnp.exp(sinks - m), axis=-1, keepdims=True)
    p = e / jnp.where(denom > 0, denom, 1.0)

    # 6. Dropout.
    if dropout_prob > 0.0 and not deterministic:
        seed = jax.random.bits(dropout_rng, dtype=jnp.uint32)
        batch_head = jnp.arange(batch)[:, None, None, None] * num_heads + jnp.arange(num_heads)[None, :, None, None]
        keep = dropout_keep(seed, batch_head, i[None, None], j[None, None], dropout_prob)
        p = jnp.where(keep, p / (1.0 - dropout_prob), 0.0)

    # 7. Weighted sum of the values.
    return jnp.einsum("bhij,bjhd->bihd", p, v, precision=highest).astype(query.dtype)
