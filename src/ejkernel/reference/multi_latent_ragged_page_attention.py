"""Reference MLA serving attention: write the new latent rows into the packed cache, then attend token by token.

The oracle of `multi_latent_ragged_page_attention(_v2)`, in float32, with Python loops over the
(concrete) index arrays; never registered.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.reference.paged_attention import quantize

HIGHEST = jax.lax.Precision.HIGHEST


def _align128(n: int) -> int:
    return -(-n // 128) * 128


def multi_latent_ragged_page_attention_reference(
    queries_nope, queries_pe, keys_values, keys_pe, kv_cache, kv_lens, block_tables, query_start_loc, distribution, *,
    softmax_scale=None, sliding_window=None, logits_soft_cap=None, q_scale=None, k_scale=None, v_scale=None,
    kv_cache_scales=None, **_unused,
):  # fmt: skip
    """`(out [T, Hq, L] float32, updated kv_cache)` of one serving step (and the updated scales with
    `kv_cache_scales`, `[pages, rows, packing]`: one per cached row).

    Cache `[pages, rows, packing, a128(L) + a128(R)]`; a page holds `rows * packing` positions, position
    `i` at `[i // packing, i % packing]`, its feature vector `[c, 0…, r, 0…]` (each part zero-padded to a
    multiple of 128). Sequence `s < distribution[2]` owns tokens `query_start_loc[s] : [s + 1]` (its new
    positions `kv_lens[s] - q_len … kv_lens[s] - 1`) and the pages `block_tables[s * P : (s + 1) * P]`.

    1. Each new token's `c = keys_values[t]` and `r = keys_pe[t]` are written at its position, cast to
       the cache dtype (sequence by sequence; not below position 0, nor on a page outside the cache); with
       scales the row `[c, 0…, r, 0…]` is `quantize`d as a whole and its scale written beside it, and the
       cache is read as `code * scale`.
    2. Query token `t` at position `p`, head `h`, over positions `i < kv_len` read after the write
       (those on a page outside the cache hold no key):
       `ℓ = scale · (q_nope·c_i + q_pe·r_i) · k_scale · q_scale`, where with `q_scale` the queries are
       first `q / q_scale` rounded to the cache dtype (saturating); then `cap · tanh(ℓ / cap)`; keys
       `i <= p` (and `i >= p - w + 1` with a window `w`); `out = v_scale · Σ softmax(ℓ)_i c_i` (0 for
       a query with no key).
    Tokens of no processed sequence are 0; `scale` defaults to `(L + R)^-0.5`.
    """
    num_tokens, num_heads, latent = queries_nope.shape
    rope = queries_pe.shape[-1]
    num_pages, rows, packing, width = kv_cache.shape
    page_size = rows * packing
    rope_col = _align128(latent)
    lens = np.asarray(kv_lens).astype(np.int64)
    num_seqs = lens.shape[0]
    tables = np.asarray(block_tables).reshape(num_seqs, -1)
    loc = np.asarray(query_start_loc).astype(np.int64)
    count = int(np.asarray(distribution)[2])
    cache = kv_cache.reshape(num_pages, page_size, width)
    scales = None if kv_cache_scales is None else kv_cache_scales.reshape(num_pages, page_size)

    sequences = []
    for s in range(count):
        start, q_len, kv_len = int(loc[s]), int(loc[s + 1] - loc[s]), int(lens[s])
        if q_len <= 0:
            continue
        pos = kv_len - q_len + np.arange(q_len)
        new = jnp.zeros((q_len, width), jnp.float32)
        new = new.at[:, :latent].set(keys_values[start : start + q_len].astype(jnp.float32))
        new = new.at[:, rope_col : rope_col + rope].set(keys_pe[start : start + q_len].astype(jnp.float32))
        if scales is None:
            new = new.astype(kv_cache.dtype)  # float32 holds every float dtype's values: one rounding, as a cast
        else:
            new, new_scales = quantize(new, kv_cache.dtype)
        pages = tables[s, np.maximum(pos, 0) // page_size]
        kept = (pos >= 0) & (pages >= 0) & (pages < num_pages)
        cache = cache.at[pages[kept], pos[kept] % page_size].set(new[kept])
        if scales is not None:
            scales = scales.at[pages[kept], pos[kept] % page_size].set(new_scales[kept])
        sequences.append((s, start, q_len, kv_len))

    scale = (latent + rope) ** -0.5 if softmax_scale is None else softmax_scale
    q_nope = jnp.asarray(queries_nope, jnp.float32)
    q_pe = jnp.asarray(queries_pe, jnp.float32)
    if q_scale is not None:
        integer = jnp.issubdtype(kv_cache.dtype, jnp.integer)
        largest = float(jnp.iinfo(kv_cache.dtype).max if integer else jnp.finfo(kv_cache.dtype).max)
        saturate = lambda q: jnp.clip(jnp.round(q) if integer else q, -largest, largest)
        quantize_q = lambda q: saturate(q / q_scale).astype(kv_cache.dtype)
        q_nope, q_pe = (quantize_q(q).astype(jnp.float32) for q in (q_nope, q_pe))
        scale *= q_scale
    if k_scale is not None:
        scale *= k_scale

    out = jnp.zeros((num_tokens, num_heads, latent), jnp.float32)
    for s, start, q_len, kv_len in sequences:
        i = np.arange(kv_len)
        pages = tables[s, i // page_size]
        where = (np.clip(pages, 0, num_pages - 1), i % page_size)
        feats = cache[where].astype(jnp.float32)  # [kv_len, width]
        if scales is not None:
            feats = feats * scales[where][:, None]
        c, r = feats[:, :latent], feats[:, rope_col : rope_col + rope]
        tokens = slice(start, start + q_len)
        logits = jnp.einsum("jhl,il->hji", q_nope[tokens], c, precision=HIGHEST)
        logits = (logits + jnp.einsum("jhr,ir->hji", q_pe[tokens], r, precision=HIGHEST)) * scale
        if logits_soft_cap is not None:
            logits = logits_soft_cap * jnp.tanh(logits / logits_soft_cap)
        p = (kv_len - q_len + np.arange(q_len))[:, None]
        allowed = (i[None, :] <= p) & ((pages >= 0) & (pages < num_pages))[None, :]
        if sliding_window is not None:
            allowed &= i[None, :] >= p - sliding_window + 1
        row_max = jnp.max(jnp.where(allowed, logits, -jnp.inf), axis=-1, keepdims=True)
        weights = jnp.exp(jnp.where(allowed, logits - jnp.where(jnp.isfinite(row_max), row_max, 0.0), -jnp.inf))
        denom = jnp.sum(weights, axis=-1, keepdims=True)
        weights = weights / jnp.where(denom > 0, denom, 1.0)
        o = jnp.einsum("hji,il->jhl", weights, c, precision=HIGHEST)
        out = out.at[tokens].set(o if v_scale is None else o * v_scale)
    if scales is None:
        return out, cache.reshape(kv_cache.shape)
    return out, cache.reshape(kv_cache.shape), scales.reshape(kv_cache_scales.shape)
