"""Reference multi-head latent attention: keys and values decompressed per head, then dense float32 attention."""

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.mla import canonical_call
from ejkernel.reference.flash_attention import flash_attention_reference


def flash_mla_reference(query, key_value, w_kc, w_vc, b_q=None, b_k=None, cu_seqlens=None, **options):
    """`[B, Sq, Hq, Dv]`: attention over keys and values decompressed from the latent `key_value`.

    Shapes: query [B, Sq, Hq, Dq]; key_value [B, Sk, rank]; w_kc [rank, Hkv, d_nope]; w_vc [rank, Hkv, Dv];
    query head h reads key/value head g = h // (Hq / Hkv). In float32:

    1. k_nope[b, j, g] = key_value[b, j] @ w_kc[:, g];   v[b, j, g] = key_value[b, j] @ w_vc[:, g].
    2. RoPE mode: no b_k: q = query, k = k_nope. Only b_k: query is [nope | rope] (Dq = d_nope + d_rope),
       k = [k_nope | b_k[b, j]]. Both: q = [query | b_q[b, i] (per head if 4-D)], k = [k_nope | b_k[b, j]].
    3. Attention as `flash_attention_reference` defines it (scale default 1/sqrt(d_nope + d_rope); causal
       and windows on top-left aligned positions; soft cap; bias and boolean attention_mask
       [1|B, 1|Hq, Sq, Sk]; sinks softmax_aux), with `cu_seqlens [N+1]` as segment ids of sequences packed
       along the sequence axis of every batch row (positions past cu[N] are padding: zero output), and
       dropout (dropout_prob > 0, deterministic=False) keyed by a seed drawn from dropout_rng.

    Options (keyword): softmax_scale, causal, attention_mask, bias, softmax_aux, logits_soft_cap,
    deterministic, dropout_rng, dropout_prob, sliding_window, softmax_dtype (see `flash_mla`). Result in
    query's dtype.
    """
    call = canonical_call(query, key_value, w_kc, w_vc, b_q, b_k, cu_seqlens, **options)
    dims = call.dims
    f32 = lambda x: None if x is None else jnp.asarray(x, jnp.float32)
    q, c, wk, wv = f32(query), f32(key_value), f32(w_kc), f32(w_vc)
    highest = jax.lax.Precision.HIGHEST
    k = jnp.einsum("bjr,rgd->bjgd", c, wk, precision=highest)  # [B, Sk, Hkv, d_nope]
    v = jnp.einsum("bjr,rgd->bjgd", c, wv, precision=highest)  # [B, Sk, Hkv, Dv]
    if b_k is not None:
        k = jnp.concatenate([k, jnp.broadcast_to(f32(b_k)[:, :, None], (*k.shape[:3], dims.rope_dim))], axis=-1)
    if b_q is not None:
        rope = f32(b_q) if b_q.ndim == 4 else jnp.broadcast_to(f32(b_q)[:, :, None], (*q.shape[:3], dims.rope_dim))
        q = jnp.concatenate([q, rope], axis=-1)
    bias, sinks = f32(options.get("bias")), f32(options.get("softmax_aux"))
    out = flash_attention_reference(q, k, v, bias, sinks, **call.attention)
    return out.astype(query.dtype)
