"""Reference serving attention: dense float32 attention over each sequence's gathered pages.

One definition (`ragged_attention_reference`) and one adapter per op that gathers each sequence's keys
and values from its layout into dense `[kv_len, Hkv, D]` arrays. A position whose page-table entry is
not a page of the cache holds no key (it is masked, and `ragged_page_attention_v3` writes nothing there).
Index arrays must be concrete (the reference loops over sequences in Python); it is the oracle of the
tests, never registered.

Quantised caches with per-token-head scales (float32, the cache's shape without its head dim) are
dequantised first (`dequantize`: `code * scale`), then attended as any cache; `ragged_page_attention_v3`
quantises the rows it writes (`quantize`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

HIGHEST = jax.lax.Precision.HIGHEST


def compiled(reference):
    """`reference` run as one compiled program: its index arrays (concrete) are closed over as constants.

    The references loop over sequences in Python at concrete lengths, so run eagerly every op compiles
    at its own shape; compiled, the call costs one compilation. Float arguments stay traced (and
    differentiable); pass index arrays as concrete arrays.
    """

    @functools.wraps(reference)
    def call(*args, **options):
        floats = [i for i, a in enumerate(args) if isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jnp.floating)]

        def with_floats(*values):
            full = list(args)
            for i, value in zip(floats, values, strict=True):
                full[i] = value
            return reference(*full, **options)

        return jax.jit(with_floats)(*(args[i] for i in floats))

    return call


def ragged_attention_reference(
    queries,
    seq_keys,
    seq_values,
    query_start,
    query_len,
    *,
    softmax_scale: float,
    kv_start=None,
    key_mask=None,
    logits_soft_cap=None,
    window=None,
    causal=True,
    softmax_aux=None,
    alibi_slopes=None,
    qq_bias=None,
    value_scale=None,
):
    """Attention of packed queries `[T, Hq, D]`, sequence by sequence, in float32.

    Sequence `s` has keys/values `seq_keys[s]`, `seq_values[s]` (`[kv_len_s, Hkv, D]`) and queries
    `queries[query_start[s] : query_start[s] + query_len[s]]`; query `j` sits at position
    `p = kv_len_s - query_len[s] + j` (the queries end the context). Query head `h` reads kv head
    `h // (Hq // Hkv)`. For query position p and key position k:

    1. `s = softmax_scale · <q, k>`; soft cap c: `s = c · tanh(s / c)`;
    2. ALiBi: `s += slope[h] · (k - (kv_len - q_len))`; query-query bias:
       `s += qq_bias[j, k - (kv_len - q_len)]` where both indices fall inside `qq_bias`;
    3. allowed: `k >= kv_start[s]` and `key_mask[s][k]` (bool `[kv_len_s]`: positions holding a key); causal
       `k <= p`; window `(left, right)`: `p - left <= k <= p + right`;
    4. softmax over the allowed keys with the sink logits (per head if `len == Hq`, else shared) in
       the denominator only; a row with no allowed key is 0;
    5. `out = value_scale · Σ p_k v_k`. Tokens of no sequence are 0.
    """
    q_all = jnp.asarray(queries, jnp.float32)
    num_tokens, num_heads, head_dim = q_all.shape
    out = jnp.zeros((num_tokens, num_heads, head_dim), jnp.float32)
    for s, (start, n) in enumerate(zip(np.asarray(query_start).tolist(), np.asarray(query_len).tolist(), strict=True)):
        if n == 0:
            continue
        k = jnp.asarray(seq_keys[s], jnp.float32)
        v = jnp.asarray(seq_values[s], jnp.float32)
        kv_len, num_kv_heads = k.shape[0], k.shape[1]
        group = num_heads // num_kv_heads
        k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)  # [kv_len, Hq, D]
        q = q_all[start : start + n]
        context = kv_len - n
        q_pos = context + np.arange(n)[:, None]
        k_pos = np.arange(kv_len)[None, :]

        logits = jnp.einsum("jhd,khd->hjk", q, k, precision=HIGHEST) * softmax_scale
        if logits_soft_cap is not None:
            logits = logits_soft_cap * jnp.tanh(logits / logits_soft_cap)
        if alibi_slopes is not None:
            logits = logits + jnp.asarray(alibi_slopes, jnp.float32)[:, None, None] * (k_pos - context)
        if qq_bias is not None:
            size = qq_bias.shape[0]
            rel = np.broadcast_to(k_pos - context, (n, kv_len))
            rows = np.broadcast_to(np.arange(n)[:, None], (n, kv_len))
            inside = (rel >= 0) & (rel < size) & (rows < size)
            bias = jnp.asarray(qq_bias, jnp.float32)[np.clip(rows, 0, size - 1), np.clip(rel, 0, size - 1)]
            logits = logits + jnp.where(inside, bias, 0.0)

        allowed = np.ones((n, kv_len), bool)
        if kv_start is not None:
            allowed &= k_pos >= int(np.asarray(kv_start)[s])
        if key_mask is not None:
            allowed &= np.asarray(key_mask[s])[None, :]
        if causal:
            allowed &= k_pos <= q_pos
        if window is not None:
            allowed &= (k_pos >= q_pos - window[0]) & (k_pos <= q_pos + window[1])
        allowed = jnp.asarray(np.broadcast_to(allowed, logits.shape))

        row_max = jnp.max(jnp.where(allowed, logits, -jnp.inf), axis=-1, initial=-jnp.inf)  # [Hq, n]
        sinks = None
        if softmax_aux is not None:
            aux = jnp.asarray(softmax_aux, jnp.float32)
            sinks = aux[:, None] if aux.shape[0] == num_heads else jnp.broadcast_to(aux, (num_heads, aux.shape[0]))
            row_max = jnp.maximum(row_max, jnp.max(sinks, axis=-1)[:, None])
        shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))[..., None]
        weights = jnp.exp(jnp.where(allowed, logits - shift, -jnp.inf))
        denom = jnp.sum(weights, axis=-1, keepdims=True)
        if sinks is not None:
            denom = denom + jnp.sum(jnp.exp(sinks[:, None, :] - shift), axis=-1, keepdims=True)
        probs = weights / jnp.where(denom > 0, denom, 1.0)
        rows_out = jnp.einsum("hjk,khd->jhd", probs, v, precision=HIGHEST)
        if value_scale is not None:
            rows_out = rows_out * value_scale
        out = out.at[start : start + n].set(rows_out)
    return out.astype(queries.dtype)


def dequantize(cache, scales):
    """`cache * scales[..., None]` in float32 (`code * scale` per row), or the cache itself without scales."""
    if scales is None:
        return cache
    return jnp.asarray(cache, jnp.float32) * jnp.asarray(scales, jnp.float32)[..., None]


def quantize(x, dtype):
    """`(codes, scales)` of rows `x [..., D]` in a float8 or int8 `dtype`: per row `scale = max|x| / M` (`M` the
    largest code: 127 for int8, the format's largest finite for float8; 1 for a zero row) and
    `code = x / scale` cast to `dtype` (int8: rounded, clipped to [-127, 127])."""
    x = jnp.asarray(x, jnp.float32)
    integer = jnp.issubdtype(jnp.dtype(dtype), jnp.integer)
    largest = float(jnp.iinfo(dtype).max if integer else jnp.finfo(dtype).max)
    amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    scales = jnp.where(amax == 0, 1.0, amax / largest)
    codes = x / scales
    codes = jnp.clip(jnp.round(codes), -largest, largest) if integer else jnp.clip(codes, -largest, largest)
    return codes.astype(dtype), scales[..., 0]


def _sequences(pages_of_k, pages_of_v, tables, lens, page_size, head_shape, num_pages):
    """Each sequence's dense `[kv_len, Hkv, D]` keys and values (its first pages, in table order) and which
    of its positions hold a key (bool `[kv_len]`: their page is one of the cache's `num_pages`).

    `pages_of_k(pages)` gives the pages `[n, page_size, Hkv, D]` of page indices `pages` (int array).
    """
    keys, values, held = [], [], []
    for row, kv_len in zip(np.asarray(tables), np.asarray(lens).tolist(), strict=True):
        pages = np.asarray(row)[: -(-kv_len // page_size)]
        in_cache = (pages >= 0) & (pages < num_pages)
        held.append(np.repeat(in_cache, page_size)[:kv_len])
        pages = np.clip(pages, 0, num_pages - 1)
        for out, pages_of in ((keys, pages_of_k), (values, pages_of_v)):
            dense = pages_of(pages).reshape(-1, *head_shape)[:kv_len] if kv_len else None
            out.append(jnp.zeros((0, *head_shape), jnp.float32) if dense is None else dense)
    return keys, values, held


def _scale(scale, head_dim):
    return head_dim**-0.5 if scale is None else scale


def _window(w):
    return None if w is None else (w - 1, 0)


def page_attention_reference(
    query, key_cache, value_cache, context_lens, block_tables, *, attn_scale=None, attn_logits_soft_cap=None,
    sliding_window=None, key_cache_scales=None, value_cache_scales=None, **_schedule_hints,
):  # fmt: skip
    """`page_attention`: query `[N, H, D]`, caches `[blocks, Hkv, block_size, D]`; query at position len - 1."""
    key_cache, value_cache = dequantize(key_cache, key_cache_scales), dequantize(value_cache, value_cache_scales)
    num_seqs, _, head_dim = query.shape
    num_blocks, num_kv_heads, block_size, _ = key_cache.shape
    keys, values, held = _sequences(
        lambda p: key_cache[p].swapaxes(1, 2),
        lambda p: value_cache[p].swapaxes(1, 2),
        block_tables,
        context_lens,
        block_size,
        (num_kv_heads, head_dim),
        num_blocks,
    )
    return ragged_attention_reference(
        query, keys, values, np.arange(num_seqs), np.ones(num_seqs, int), key_mask=held,
        softmax_scale=_scale(attn_scale, head_dim), logits_soft_cap=attn_logits_soft_cap,
        window=_window(sliding_window),
    )  # fmt: skip


def prefill_page_attention_reference(
    query, key_cache, value_cache, context_len, page_indices, *, softmax_scale=None, attn_logits_soft_cap=None,
    sliding_window=None, key_cache_scales=None, value_cache_scales=None, **_unused,
):  # fmt: skip
    """`prefill_page_attention`: the `chunk` last queries of one sequence; caches `[Hkv, pages, page_size, D]`."""
    key_cache, value_cache = dequantize(key_cache, key_cache_scales), dequantize(value_cache, value_cache_scales)
    chunk, _, head_dim = query.shape
    num_kv_heads, num_pages, page_size, _ = key_cache.shape
    keys, values, held = _sequences(
        lambda p: jnp.moveaxis(key_cache[:, p], 0, 2),
        lambda p: jnp.moveaxis(value_cache[:, p], 0, 2),
        np.asarray(page_indices)[None],
        np.asarray(context_len).reshape(1),
        page_size,
        (num_kv_heads, head_dim),
        num_pages,
    )
    return ragged_attention_reference(
        query, keys, values, [0], [chunk], key_mask=held, softmax_scale=_scale(softmax_scale, head_dim),
        logits_soft_cap=attn_logits_soft_cap, window=_window(sliding_window),
    )  # fmt: skip


def _ragged_queries(query_start_loc, count):
    loc = np.asarray(query_start_loc)
    lengths = np.diff(loc)
    lengths[int(np.asarray(count).reshape(-1)[0]) :] = 0
    return loc[:-1], lengths


def ragged_page_attention_v2_reference(
    queries, kv_pages, context_lens, block_tables, query_start_loc, num_seqs, softmax_aux=None, *,
    softmax_scale=None, logits_soft_cap=None, compute_dtype=jnp.bfloat16, sliding_window=None, kv_cache_scales=None,
    **_unused,
):  # fmt: skip
    """`ragged_page_attention_v2`: cache `[pages, page_size, 2 Hkv, D]` with K at even, V at odd heads.

    Queries, keys and values are rounded to `compute_dtype` (the dtype of the matmul operands); a quantised
    cache's codes are, then dequantised with `kv_cache_scales`.
    """
    _, _, head_dim = queries.shape
    num_pages, page_size, combined, _ = kv_pages.shape
    out_dtype = queries.dtype
    if compute_dtype is not None:
        queries, kv_pages = queries.astype(compute_dtype), kv_pages.astype(compute_dtype)
    kv_pages = dequantize(kv_pages, kv_cache_scales)
    keys, values, held = _sequences(
        lambda p: kv_pages[p][:, :, 0::2],
        lambda p: kv_pages[p][:, :, 1::2],
        block_tables,
        context_lens,
        page_size,
        (combined // 2, head_dim),
        num_pages,
    )
    start, lengths = _ragged_queries(query_start_loc, num_seqs)
    out = ragged_attention_reference(
        queries, keys, values, start, lengths, key_mask=held, softmax_scale=_scale(softmax_scale, head_dim),
        logits_soft_cap=logits_soft_cap, window=_window(sliding_window), softmax_aux=softmax_aux,
    )  # fmt: skip
    return out.astype(out_dtype)


def ragged_page_attention_v3_reference(
    queries, keys, values, kv_cache, kv_lens, block_tables, query_start_loc, distribution, softmax_aux=None, *,
    softmax_scale=1.0, sliding_window=None, logits_soft_cap=None, q_scale=None, k_scale=None, v_scale=None,
    kv_cache_scales=None, **_unused,
):  # fmt: skip
    """`ragged_page_attention_v3`: `(out, cache)`, or `(out, cache, scales)` with `kv_cache_scales`; the new
    keys/values are written first, token by token.

    Cache `[pages, page_size, ceil(2 Hkv / packing), packing, D_pad]`: combined head `c = 2h` holds key
    head h and `2h + 1` its value, at `[c // packing, c % packing]` (a written slot's other heads and
    padded dims are 0). Token j of sequence s goes to position `kv_lens[s] - q_len + j`, sequence by
    sequence (not below position 0, nor on a page outside the cache). With `q_scale` the queries are
    `q / q_scale` rounded to the cache dtype (saturated to its range; the output keeps the queries'
    dtype) and the logits are scaled by `q_scale`; `k_scale` scales the logits, `v_scale` the output.
    With `kv_cache_scales` (`[pages, page_size, groups, packing]`) each written token-head is `quantize`d and
    its scale written beside it (a written slot's unused heads get scale 1); the cache is read dequantised.
    """
    _, num_kv_heads, head_dim = keys.shape
    num_pages, page_size, groups, packing, width = kv_cache.shape
    kv_lens = np.asarray(kv_lens)
    max_seqs = kv_lens.shape[0]
    tables = np.asarray(block_tables).reshape(max_seqs, -1)
    start, lengths = _ragged_queries(query_start_loc, np.asarray(distribution)[2])
    combined = kv_cache.reshape(num_pages, page_size, groups * packing, width)
    scales = None if kv_cache_scales is None else kv_cache_scales.reshape(num_pages, page_size, groups * packing)
    for s in range(max_seqs):
        pos = kv_lens[s] - lengths[s] + np.arange(lengths[s])
        tokens = slice(int(start[s]), int(start[s] + lengths[s]))
        new_keys, new_values = keys[tokens], values[tokens]
        row_scales = jnp.ones((lengths[s], groups * packing), jnp.float32)
        if scales is not None:
            (new_keys, key_scales), (new_values, value_scales) = (
                quantize(x, kv_cache.dtype) for x in (new_keys, new_values)
            )
            row_scales = row_scales.at[:, 0 : 2 * num_kv_heads : 2].set(key_scales)
            row_scales = row_scales.at[:, 1 : 2 * num_kv_heads : 2].set(value_scales)
        rows = jnp.zeros((lengths[s], groups * packing, width), kv_cache.dtype)  # unused heads and dims are 0
        rows = rows.at[:, 0 : 2 * num_kv_heads : 2, :head_dim].set(new_keys.astype(kv_cache.dtype))
        rows = rows.at[:, 1 : 2 * num_kv_heads : 2, :head_dim].set(new_values.astype(kv_cache.dtype))
        pages = tables[s, np.maximum(pos, 0) // page_size]
        kept = (pos >= 0) & (pages >= 0) & (pages < num_pages)
        combined = combined.at[pages[kept], pos[kept] % page_size].set(rows[kept])
        if scales is not None:
            scales = scales.at[pages[kept], pos[kept] % page_size].set(row_scales[kept])
    new_cache = combined.reshape(kv_cache.shape)
    readable = dequantize(combined, scales)
    seq_keys, seq_values, held = _sequences(
        lambda p: readable[p][:, :, 0 : 2 * num_kv_heads : 2, :head_dim],
        lambda p: readable[p][:, :, 1 : 2 * num_kv_heads : 2, :head_dim],
        tables,
        kv_lens,
        page_size,
        (num_kv_heads, head_dim),
        num_pages,
    )
    scale = _scale(softmax_scale, head_dim)
    if q_scale is not None:
        integer = jnp.issubdtype(kv_cache.dtype, jnp.integer)
        largest = float(jnp.iinfo(kv_cache.dtype).max if integer else jnp.finfo(kv_cache.dtype).max)
        quantized = jnp.clip(queries / q_scale, -largest, largest)
        quantized = jnp.round(quantized) if integer else quantized
        queries = quantized.astype(kv_cache.dtype).astype(queries.dtype)
        scale *= q_scale
    if k_scale is not None:
        scale *= k_scale
    out = ragged_attention_reference(
        queries, seq_keys, seq_values, start, lengths, key_mask=held, softmax_scale=scale,
        logits_soft_cap=logits_soft_cap,
        window=_window(sliding_window), softmax_aux=softmax_aux, value_scale=v_scale,
    )  # fmt: skip
    if scales is None:
        return out, new_cache
    return out, new_cache, scales.reshape(kv_cache_scales.shape)


def ragged_decode_attention_reference(
    query, key, value, sequence_start, sequence_end, softmax_aux=None, *, softmax_scale=None, sliding_window=None,
    logits_soft_cap=None, key_cache_scales=None, value_cache_scales=None, **_unused,
):  # fmt: skip
    """`ragged_decode_attention`: dense `[B, S, Hkv, D]` K/V; row b's query at `end - 1` sees keys `[start, end)`.

    An int window `w` keeps `[p - w + 1, p]`; a pair `(left, right)` keeps `[p - left, p + right]`.
    """
    key, value = dequantize(key, key_cache_scales), dequantize(value, value_cache_scales)
    batch, _, _, head_dim = key.shape
    q = query.reshape(batch, -1, head_dim)
    end = np.asarray(sequence_end)
    window = sliding_window if isinstance(sliding_window, tuple | list) else _window(sliding_window)
    out = ragged_attention_reference(
        q, [key[b, : end[b]] for b in range(batch)], [value[b, : end[b]] for b in range(batch)],
        np.arange(batch), np.ones(batch, int), kv_start=sequence_start, softmax_scale=_scale(softmax_scale, head_dim),
        logits_soft_cap=logits_soft_cap, window=window, softmax_aux=softmax_aux,
    )  # fmt: skip
    return out.reshape(query.shape)


def unified_attention_reference(
    queries, key_cache, value_cache, kv_lens, block_tables, query_start_loc, alibi_slopes=None, qq_bias=None,
    softmax_aux=None, *, softmax_scale=None, causal=True, sliding_window=None, logits_soft_cap=None,
    key_cache_scales=None, value_cache_scales=None, **_unused,
):  # fmt: skip
    """`unified_attention`: caches `[blocks, block_size, Hkv, D]`; ALiBi `slope · (k - (kv_len - q_len))`."""
    key_cache, value_cache = dequantize(key_cache, key_cache_scales), dequantize(value_cache, value_cache_scales)
    _, _, head_dim = queries.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    keys, values, held = _sequences(
        lambda p: key_cache[p], lambda p: value_cache[p], block_tables, kv_lens, block_size, (num_kv_heads, head_dim),
        num_blocks,
    )  # fmt: skip
    start, lengths = _ragged_queries(query_start_loc, kv_lens.shape[0])
    return ragged_attention_reference(
        queries, keys, values, start, lengths, key_mask=held, softmax_scale=_scale(softmax_scale, head_dim),
        causal=causal,
        logits_soft_cap=logits_soft_cap, window=_window(sliding_window), softmax_aux=softmax_aux,
        alibi_slopes=alibi_slopes, qq_bias=qq_bias,
    )  # fmt: skip
