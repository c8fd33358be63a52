"""Helpers for callers of the serving ops: valid random inputs for `ragged_page_attention_v3`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.kernels._common.paged_attention.kv_cache import kv_packing, v3_cache_shape

__all__ = ["make_dummy_rpa_inputs"]


def _query_lengths(rng, kv_lens: np.ndarray, decode: int) -> np.ndarray:
    q_lens = np.ceil(rng.uniform(0.0, 1.0, len(kv_lens)) * kv_lens).astype(np.int64)
    q_lens = np.maximum(q_lens, 1)
    q_lens[:decode] = 1
    return q_lens


def make_dummy_rpa_inputs(
    *,
    rng_seed: int = 0,
    num_seqs: int = 4,
    pages_per_seq: int = 3,
    page_size: int = 16,
    num_q_heads: int = 8,
    num_kv_heads: int = 2,
    head_dim: int = 80,
    kv_dtype: Any = jnp.float32,
    q_dtype: Any = None,
    kv_len_max: int | None = None,
    total_q: int | None = None,
    total_num_pages: int | None = None,
    decode_prefill_mixed: tuple[int, int, int] | None = None,
) -> dict[str, Any]:
    """Random, valid inputs of `ragged_page_attention_v3` as a dict of its argument names.

    Keys: `queries [T, Hq, D]` (`q_dtype`, default `kv_dtype`), `keys`/`values [T, Hkv, D]`, `kv_cache`
    (its packed layout, random contents), `kv_lens`, `block_tables` (flat, `num_seqs * pages_per_seq`),
    `query_start_loc`, `distribution` (int32), and `_meta` (the lengths and sizes, for inspection).

    Sequence lengths are random in `[1, kv_len_max]` (default: what `pages_per_seq` pages hold) with
    1 to `kv_len` new queries each; with `total_q`, the `total_q` queries are spread evenly and each
    sequence's context is just its queries (a prefill). `decode_prefill_mixed = (i, j, k)` (k ==
    num_seqs) makes sequences `[0, i)` one-token decodes and is returned as `distribution`; the
    default is `[0, 0, num_seqs]`. Pages are a random permutation of the cache's `total_num_pages`
    (default `num_seqs * pages_per_seq`); page table entries past a sequence's length are 0.
    """
    rng = np.random.default_rng(rng_seed)
    q_dtype = kv_dtype if q_dtype is None else q_dtype
    packing = kv_packing(kv_dtype)
    if page_size % packing:
        raise ValueError(f"page_size ({page_size}) must be a multiple of the {kv_dtype} packing ({packing})")
    capacity = pages_per_seq * page_size
    kv_len_max = capacity if kv_len_max is None else min(kv_len_max, capacity)
    i, j, k = (0, 0, num_seqs) if decode_prefill_mixed is None else decode_prefill_mixed
    if not 0 <= i <= j <= k == num_seqs:
        raise ValueError(f"decode_prefill_mixed must be (i, j, k) with 0 <= i <= j <= k == {num_seqs}, got {(i, j, k)}")
    if total_q is None:
        kv_lens = rng.integers(1, kv_len_max + 1, num_seqs)
        q_lens = _query_lengths(rng, kv_lens, i)
    else:
        rest = num_seqs - i
        if total_q < num_seqs or (rest == 0 and total_q != num_seqs) or total_q - i > rest * kv_len_max:
            raise ValueError(
                f"total_q ({total_q}) cannot be spread over {num_seqs} sequences ({i} of one token, "
                f"the others at most {kv_len_max})"
            )
        q_lens = np.ones(num_seqs, np.int64)
        if rest:
            q_lens[i:] = (total_q - i) // rest
            q_lens[i : i + (total_q - i) % rest] += 1
        kv_lens = q_lens.copy()
    pages_needed = -(-kv_lens // page_size)
    total_pages = num_seqs * pages_per_seq if total_num_pages is None else int(total_num_pages)
    if total_pages < pages_needed.sum():
        raise ValueError(
            f"total_num_pages ({total_pages}) must hold the {int(pages_needed.sum())} pages the lengths need"
        )
    order = rng.permutation(total_pages)
    tables = np.zeros((num_seqs, pages_per_seq), np.int32)
    cursor = 0
    for s, n in enumerate(pages_needed):
        tables[s, :n] = order[cursor : cursor + n]
        cursor += n

    query_start_loc = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    num_tokens = int(query_start_loc[-1])
    kq, kk, kv, kc = jax.random.split(jax.random.PRNGKey(rng_seed), 4)
    cache_shape = v3_cache_shape(total_pages, page_size, num_kv_heads, head_dim, kv_dtype)
    return dict(
        queries=jax.random.normal(kq, (num_tokens, num_q_heads, head_dim), jnp.float32).astype(q_dtype),
        keys=jax.random.normal(kk, (num_tokens, num_kv_heads, head_dim), jnp.float32).astype(kv_dtype),
        values=jax.random.normal(kv, (num_tokens, num_kv_heads, head_dim), jnp.float32).astype(kv_dtype),
        kv_cache=jax.random.normal(kc, cache_shape, jnp.float32).astype(kv_dtype),
        kv_lens=jnp.asarray(kv_lens, jnp.int32),
        block_tables=jnp.asarray(tables.reshape(-1)),
        query_start_loc=jnp.asarray(query_start_loc),
        distribution=jnp.asarray([i, j, k], jnp.int32),
        _meta=dict(
            q_lens=q_lens.tolist(),
            kv_lens=kv_lens.tolist(),
            num_seqs=num_seqs,
            pages_per_seq=pages_per_seq,
            page_size=page_size,
            total_pages=total_pages,
            packing=packing,
            head_dim=head_dim,
        ),
    )
