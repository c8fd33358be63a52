"""Reference native sparse attention (NSA): its two branches, dense, one sequence at a time, in float32."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np


def _masked_softmax_attention(scores, allowed, values):
    """softmax over the allowed entries of `scores [L, H, K]` times `values [K, H, Dv]`; empty rows give 0."""
    row_max = jnp.max(jnp.where(allowed, scores, -jnp.inf), axis=-1, keepdims=True, initial=-jnp.inf)
    shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
    e = jnp.where(allowed, jnp.exp(jnp.where(allowed, scores - shift, 0.0)), 0.0)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    p = e / jnp.where(denom > 0, denom, 1.0)
    return jnp.einsum("lhk,khd->lhd", p, values, precision=jax.lax.Precision.HIGHEST), p


def _one_sequence(q, k, v, g_cmp, g_slc, g_swa, indices, counts, *, block_size, scale, top_n, window_size):
    """NSA of one sequence: q [L, H, D], k [L, Hkv, D], v [L, Hkv, Dv]; gates [L, H]; indices [L, Hkv, n]."""
    length, heads, _ = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    bs = block_size
    t = jnp.arange(length)
    kv_of_head = jnp.arange(heads) // group

    # Compressed branch: each complete block of bs tokens becomes the mean of its keys and of its values;
    # query t sees the blocks that end at or before it.
    complete = length // bs
    k_cmp = k[: complete * bs].reshape(complete, bs, kv_heads, k.shape[-1]).mean(axis=1)
    v_cmp = v[: complete * bs].reshape(complete, bs, kv_heads, v.shape[-1]).mean(axis=1)
    c = jnp.arange(complete)
    scores = jnp.einsum("lhd,chd->lhc", q, k_cmp[:, kv_of_head], precision=jax.lax.Precision.HIGHEST) * scale
    seen = ((c[None, :] + 1) * bs <= t[:, None] + 1)[:, None, :]
    o_cmp, p_cmp = _masked_softmax_attention(scores, seen, v_cmp[:, kv_of_head])

    # Block selection from the compressed scores, when no indices are given: per key/value head, the
    # blocks with the most probability summed over its query heads; the query's own block always comes
    # first, later blocks never; ties go to the lower block index.
    num_blocks = -(-length // bs)
    if indices is None:
        importance = p_cmp.reshape(length, kv_heads, group, complete).sum(axis=2)
        importance = jnp.pad(importance, ((0, 0), (0, 0), (0, num_blocks - complete)))
        blocks = jnp.arange(num_blocks)
        own = (t // bs)[:, None, None]
        importance = jnp.where(blocks == own, jnp.inf, jnp.where(blocks < own, importance, -jnp.inf))
        order = jnp.argsort(-jax.lax.stop_gradient(importance), axis=-1, stable=True)[..., :top_n]
        picked = jnp.take_along_axis(importance, order, axis=-1)
        indices = jnp.where(picked == -jnp.inf, -1, order)

    # Selected branch: query t attends the tokens s <= t of the listed blocks (the first `counts` entries;
    # -1 lists nothing, a repeated block counts once).
    n = indices.shape[-1]
    listed = (jnp.arange(n) < counts[..., None]) & (indices >= 0)  # [L, Hkv, n]
    block_of_key = jnp.arange(length) // bs
    selected = jnp.any(listed[..., None] & (indices[..., None] == block_of_key), axis=2)  # [L, Hkv, L]
    allowed = selected[:, kv_of_head] & (jnp.arange(length)[None, None, :] <= t[:, None, None])
    scores = jnp.einsum("lhd,shd->lhs", q, k[:, kv_of_head], precision=jax.lax.Precision.HIGHEST) * scale
    o_slc, _ = _masked_softmax_attention(scores, allowed, v[:, kv_of_head])

    out = o_slc if g_slc is None else o_slc * g_slc[..., None]
    if g_cmp is not None:
        out = out + o_cmp * g_cmp[..., None]
    if g_swa is not None:  # sliding branch: the keys t - window_size < s <= t
        s = jnp.arange(length)[None, None, :]
        in_window = (s <= t[:, None, None]) & (s > t[:, None, None] - window_size)
        o_swa, _ = _masked_softmax_attention(scores, jnp.broadcast_to(in_window, scores.shape), v[:, kv_of_head])
        out = out + o_swa * g_swa[..., None]
    return out


def native_sparse_attention_reference(
    query,
    key,
    value,
    g_cmp=None,
    g_slc=None,
    block_indices=None,
    block_counts=16,
    cu_seqlens=None,
    g_swa=None,
    *,
    block_size: int = 64,
    softmax_scale: float | None = None,
    window_size: int = 0,
):
    """Native sparse attention of query [B, S, H, D] over key [B, S, Hkv, D] / value [B, S, Hkv, Dv].

    Per sequence (a batch row, or with `cu_seqlens [N+1]` and B = 1 each packed sequence), with
    positions counted from the sequence's start, blocks of `block_size` keys, and query head h reading
    key/value head h // (H // Hkv):
    - compressed branch: block c is represented by the mean of its keys and of its values; query t
      attends (softmax) the complete blocks c with (c + 1) · block_size <= t + 1; none gives 0;
    - selection: `block_indices [B, S, Hkv, n]` lists blocks per token and key/value head, of which the
      first `block_counts` (int, or [B, S, Hkv]) count and -1 lists nothing. Without indices, the
      blocks are chosen from the compressed branch: per key/value head, the summed probability of its
      query heads ranks the earlier blocks, the query's own block always comes first, and the top
      `block_counts` (all of them, ranked, for an array of counts) are listed;
    - selected branch: query t attends (softmax) the keys s <= t of its listed blocks;
    - sliding branch (only with `g_swa` and `window_size > 0`): query t attends the keys
      t - window_size < s <= t;
    - out = g_slc · selected (the selected branch alone without `g_slc`) + g_cmp · compressed (only
      with `g_cmp`) + g_swa · sliding. Gates are [B, S, H]. Returns [B, S, H, Dv] in query.dtype; scale
      `D ** -0.5`.
    """
    out_dtype = query.dtype
    f32 = lambda x: None if x is None else jnp.asarray(x, jnp.float32)
    q, k, v, g_cmp, g_slc, g_swa = (f32(x) for x in (query, key, value, g_cmp, g_slc, g_swa))
    batch, seq_len, _, dim = q.shape
    kv_heads = k.shape[2]
    scale = dim**-0.5 if softmax_scale is None else softmax_scale
    if isinstance(block_counts, int):
        top_n = min(block_counts, -(-seq_len // block_size))
        counts = jnp.full((batch, seq_len, kv_heads), block_counts, jnp.int32)
    else:
        top_n = -(-seq_len // block_size)
        counts = jnp.asarray(block_counts, jnp.int32)
    bounds = [(b, 0, seq_len) for b in range(batch)]
    if cu_seqlens is not None:
        cu = np.asarray(cu_seqlens)
        bounds = [(0, int(s), int(e)) for s, e in itertools.pairwise(cu)]
    out = jnp.zeros((*q.shape[:3], v.shape[-1]), jnp.float32)
    for b, start, end in bounds:
        if end == start:
            continue
        cut = lambda x, b=b, start=start, end=end: None if x is None else x[b, start:end]
        top = min(top_n, -(-(end - start) // block_size))
        seq_out = _one_sequence(
            cut(q),
            cut(k),
            cut(v),
            cut(g_cmp),
            cut(g_slc),
            cut(g_swa),
            cut(block_indices),
            cut(counts),
            block_size=block_size,
            scale=scale,
            top_n=top if block_indices is None else None,
            window_size=window_size,
        )
        out = out.at[b, start:end].set(seq_out)
    return out.astype(out_dtype)
