"""What the six serving ops share: one ragged, paged attention problem and the math every platform needs.

`page_attention`, `prefill_page_attention`, `ragged_page_attention_v2/v3`, `ragged_decode_attention` and
`unified_attention` are one computation. Each sequence `s` owns a list of cache pages (a row of its page
table) holding its `kv_len[s]` keys and values; its `q_len[s]` queries are the LAST `q_len[s]` positions
of that context (query `j` sits at position `kv_len - q_len + j`) and attend causally over its keys. The
ops differ only in how they lay out queries, pages and options. This module turns each op's arguments
into one `PagedBatch` (its `*_batch` adapters) that every platform's core reads:

- the caches are viewed as 2-D `[rows, head_dim]` arrays (a free reshape of every layout), and
  `CacheRows` says where the row of (page, slot, kv head) is: one addressing rule for all six layouts;
- per sequence: query start and length, key length, first valid key (`kv_start`, only the dense
  `ragged_decode_attention` has one), and its page table row.

Shared math: the query tiles the cores work on (`query_tiles`), the key span a tile may see
(`key_span`), the biases and masks of a logit tile (`tile_bias`, `adjust_logits`), the online softmax
step, the merge of per-split partial sums with the sinks (`finalize`), the query rows a kernel reads
(`prepare_tiles`, `finish_tiles`) and the cache write of `ragged_page_attention_v3` (`write_kv_cache`).
`implementation` wraps a platform's core in each op's signature. The public functions check their
arguments with the `check_*` helpers here: index values through `ejkernel.kernels._common.checks` (outside `jit`,
and under it with `EJKERNEL_CHECKS=1`). Otherwise every index value has one meaning, in every core
(the adapters clamp, the cores mask):

- a key length is clamped to `[0, capacity]` (the table's positions, or the op's bound), a first key
  to `[0, length]`; queries keep the positions `kv_len - q_len + j`, so queries before position 0
  (more queries than keys) see no key causally and give zeros;
- query bounds are clamped to `[0, T]` and made non-decreasing (`ragged_queries`); the sequence
  count to `[0, N]`; tokens of no sequence give zeros;
- a position whose page-table entry is not a page of the cache holds no key (`page_in_cache`:
  masked, it adds nothing), and a new token is not written there (`new_token_rows`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ejkernel.kernels._common.attention import fold_sinks, join_sink
from ejkernel.kernels._common.checks import check_values, checks_enabled, is_traced
from ejkernel.kernels._common.search import sorted_position

DEFAULT_MASK_VALUE = -2.381976426469702e38
# A mask value at or below this is "minus infinity" for every logit these ops produce: masked keys are
# always excluded exactly, so a mask value above it (which would give masked keys weight) is refused.
MASK_VALUE_LIMIT = -1e4


# ---- the canonical problem ----


@dataclasses.dataclass(frozen=True)
class CacheRows:
    """Where key/value rows live in a cache viewed as `[rows, width]` (width >= head dim).

    The row of (page, slot, kv head) is `page * page_stride + slot * slot_stride + head * head_stride`,
    plus `key_offset` for the key and `value_offset` for the value (interleaved K/V caches).
    """

    page_size: int
    num_pages: int
    page_stride: int
    slot_stride: int
    head_stride: int
    key_offset: int = 0
    value_offset: int = 0


@dataclasses.dataclass(frozen=True)
class Static:
    """Everything fixed at trace time (hashable)."""

    rows: CacheRows
    num_kv_heads: int
    head_dim: int  # of the queries; cache rows may be wider (ragged_page_attention_v3 pads to 128)
    softmax_scale: float
    soft_cap: float | None = None
    window: tuple[int, int] | None = None  # keys q - left <= k <= q + right
    causal: bool = True
    value_scale: float | None = None  # multiplies the output (dequantised values)
    compute_dtype: str | None = None  # dtype of the matmul operands (None: the queries')
    max_kv_len: int = 0  # a bound on every kv_len: the page table's capacity, or a caller's promise
    num_splits: int = 0  # a hint: how many parts a long context is split in (0: the kernel decides)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagedBatch:
    """The ragged, paged attention problem of one call (a pytree; `static` is its static part).

    queries `[T, Hq, D]`; key_rows / value_rows `[rows, width]`; page_tables `[N, W]` int32;
    query_start / query_len / kv_len `[N]` int32 (sequences the call ignores have query_len 0);
    kv_start `[N]` int32 or None; sinks `[Hq]` float32 (one log-sum-exp of sink logits per head) or
    None; alibi_slopes `[Hq]` or None; qq_bias `[Tq, Tq]` or None.
    """

    queries: jax.Array
    key_rows: jax.Array
    value_rows: jax.Array
    page_tables: jax.Array
    query_start: jax.Array
    query_len: jax.Array
    kv_len: jax.Array
    kv_start: jax.Array | None = None
    sinks: jax.Array | None = None
    alibi_slopes: jax.Array | None = None
    qq_bias: jax.Array | None = None
    static: Static = dataclasses.field(metadata=dict(static=True), default=None)

    @property
    def num_tokens(self) -> int:
        return self.queries.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.page_tables.shape[0]

    @property
    def num_heads(self) -> int:
        return self.queries.shape[1]


# ---- argument checks ----


def check_float(name: str, x, dtypes=None) -> None:
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {jnp.result_type(x)}")
    if dtypes is not None and jnp.dtype(x.dtype) not in dtypes:
        raise TypeError(f"{name} must have dtype {'/'.join(str(d) for d in dtypes)}, got {x.dtype}")


def check_shape(name: str, x, shape: tuple, layout: str) -> None:
    """`x.shape == shape`, where a None entry matches any size."""
    if x.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, x.shape, strict=True)):
        want = tuple("?" if s is None else s for s in shape)
        raise ValueError(f"{name} must be {layout} = {want}, got shape {tuple(x.shape)}")


def check_heads(num_heads: int, num_kv_heads: int) -> None:
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_heads}) must be a multiple of key/value heads ({num_kv_heads})")


def check_same_dtype(names: str, *xs) -> None:
    if len({jnp.dtype(x.dtype) for x in xs}) > 1:
        raise TypeError(f"{names} must share a dtype, got {', '.join(str(x.dtype) for x in xs)}")


def resolve_scale(scale, head_dim: int, name: str = "softmax_scale") -> float:
    if scale is None:
        return head_dim**-0.5
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        raise ValueError(f"{name} must be a finite number or None, got {scale!r}")
    return float(scale)


def check_soft_cap(cap, name: str = "logits_soft_cap") -> float | None:
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, int | float) or not cap > 0:
        raise ValueError(f"{name} must be a positive number or None, got {cap!r}")
    return float(cap)


def check_mask_value(mask_value, name: str = "mask_value") -> None:
    """Masked keys are excluded exactly; any mask value at or below MASK_VALUE_LIMIT means the same."""
    if mask_value is not None and not mask_value <= MASK_VALUE_LIMIT:
        raise ValueError(
            f"{name} must be None or <= {MASK_VALUE_LIMIT:g} (masked keys are always excluded exactly), "
            f"got {mask_value!r}"
        )


def last_positions_window(sliding_window, name: str = "sliding_window") -> tuple[int, int] | None:
    """An int `w` of the paged ops keeps the last `w` positions up to the query's own: `(w - 1, 0)`."""
    if sliding_window is None:
        return None
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int | np.integer) or sliding_window < 1:
        raise ValueError(f"{name} must be a positive int or None, got {sliding_window!r}")
    return (int(sliding_window) - 1, 0)


def decode_window(sliding_window, name: str = "sliding_window") -> tuple[int, int] | None:
    """`ragged_decode_attention`: an int as in `last_positions_window`, or a `(left, right)` pair."""
    if isinstance(sliding_window, tuple | list):
        if len(sliding_window) != 2 or any(
            isinstance(w, bool) or not isinstance(w, int | np.integer) or w < 0 for w in sliding_window
        ):
            raise ValueError(f"{name} must be an int, a (left, right) pair of ints >= 0, or None, got {sliding_window}")
        return (int(sliding_window[0]), int(sliding_window[1]))
    return last_positions_window(sliding_window, name)


def check_sinks(name: str, sinks, num_heads: int, *, per_head: bool) -> None:
    if sinks is None:
        return
    check_float(name, sinks)
    if sinks.ndim != 1 or sinks.shape[0] == 0 or (per_head and sinks.shape[0] != num_heads):
        want = f"[{num_heads}] (one sink logit per query head)" if per_head else "1-D and non-empty"
        raise ValueError(f"{name} must be {want}, got shape {tuple(sinks.shape)}")


class _InOrder:
    """`check_values` calls that report only the first failure, as eager checks do: under `jit` they run
    unordered, so each stays silent once an earlier one (or `fine` false: earlier checks) failed."""

    def __init__(self, xp, fine=True):
        self.xp, self.fine = xp, xp.asarray(fine)

    def __call__(self, name: str, values, valid, expected: str) -> None:
        check_values(name, values, valid | ~self.fine, expected)
        self.fine = self.fine & self.xp.all(valid)


def check_sequence_values(
    *, page_tables, kv_len, page_size: int, num_pages: int, names: dict[str, str], query_start_loc=None,
    num_tokens: int = 0, active=None, kv_start=None, kv_capacity: int | None = None, queries_fit: bool = True,
    starts_at_zero: bool = True, prior_ok=True,
) -> None:  # fmt: skip
    """Values of the index arrays (`ejkernel.kernels._common.checks.check_values`: eager, or under `jit` opted in).

    `names` maps "page_tables", "kv_len" (and "query_start_loc", "kv_start", "active") to the op's argument
    names. Without `query_start_loc` each sequence has one query; with it, its first `active + 1` bounds
    rise (from 0 if `starts_at_zero`) to at most `num_tokens`. Only the first `active` sequences are
    checked (the op ignores the others), and only the pages a sequence's `kv_len` reaches must be pages
    of the cache (`page_tables` is `[N, W]` or flat `[N * W]`). With `queries_fit`, no sequence has more
    queries than keys (they end its context). `prior_ok`: whether the op's earlier checks passed (else
    these report nothing).
    """
    traced = is_traced(page_tables, kv_len, query_start_loc, active, kv_start, prior_ok)
    if traced and not checks_enabled():
        return
    xp = jnp if traced else np
    check = _InOrder(xp, prior_ok)
    lens = xp.asarray(kv_len).reshape(-1).astype(xp.int32)
    num_seqs = lens.shape[0]
    if num_seqs == 0:  # no sequences: nothing to check
        return
    tables = xp.asarray(page_tables)
    capacity = (tables.size // num_seqs) * page_size
    capacity = capacity if kv_capacity is None else min(capacity, kv_capacity)
    count = num_seqs
    if active is not None:
        active = xp.asarray(active).reshape(-1)[0].astype(xp.int32)
        valid = (active >= 0) & (active <= num_seqs)
        check(names["active"], active, valid, f"[0, {num_seqs}] (the sequences given)")
        count = xp.clip(active, 0, num_seqs)
    live = xp.arange(num_seqs) < count
    q_lens = xp.ones((num_seqs,), xp.int32)
    if query_start_loc is not None:
        name, loc = names["query_start_loc"], xp.asarray(query_start_loc).reshape(-1).astype(xp.int32)
        index = xp.arange(num_seqs + 1)
        lower = xp.concatenate([xp.zeros((1,), xp.int32), loc[:-1]])
        upper = xp.where((index == 0) & starts_at_zero, 0, num_tokens)
        valid = (index > count) | ((loc >= lower) & (loc <= upper))
        rising = "from 0 to at most" if starts_at_zero else "within"
        check(name, loc, valid, f"[{name}[i - 1], {num_tokens}] (rising {rising} the {num_tokens} tokens)")
        q_lens = loc[1:] - loc[:-1]
    kv = names["kv_len"]
    check(kv, lens, ~live | ((lens >= 0) & (lens <= capacity)), f"[0, {capacity}]")
    if kv_start is not None:
        first = xp.asarray(kv_start).reshape(-1).astype(xp.int32)
        check(names["kv_start"], first, ~live | ((first >= 0) & (first <= lens)), f"[0, {kv}[i]]")
    if queries_fit:
        expected = f"[its number of queries, {capacity}] (a sequence's queries are the last positions of its context)"
        check(kv, lens, ~live | (lens >= q_lens), expected)
    rows = tables.reshape(num_seqs, -1)
    pages = -(-xp.clip(lens, 0, capacity) // page_size)
    used = live[:, None] & (xp.arange(rows.shape[1])[None, :] < pages[:, None])
    valid = (~used | page_in_cache(rows, num_pages)).reshape(tables.shape)
    check(names["page_tables"], tables, valid, f"[0, {num_pages}) (the pages of the cache)")


def check_distribution(distribution, query_start_loc, num_seqs: int, *, decode_counts: bool):
    """`distribution = [i, j, k]` with `0 <= i <= j <= k <= num_seqs`; with `decode_counts`, sequences
    `[0, i)` hold one query each (`query_start_loc`). Returns whether they passed (`prior_ok` of the
    op's next checks)."""
    traced = is_traced(distribution, query_start_loc)
    if traced and not checks_enabled():
        return True
    xp = jnp if traced else np
    check = _InOrder(xp)
    dist = xp.asarray(distribution).reshape(-1).astype(xp.int32)
    lower = xp.concatenate([xp.zeros((1,), xp.int32), dist[:-1]])
    valid = (dist >= lower) & (dist <= num_seqs)
    check("distribution", dist, valid, f"the order 0 <= i <= j <= k <= {num_seqs} of [i, j, k]")
    if decode_counts:
        loc = xp.asarray(query_start_loc).reshape(-1).astype(xp.int32)
        decode = xp.arange(num_seqs) < dist[0]
        q_lens = loc[1:] - loc[:-1]
        expected = "{1} (distribution[0] = i makes sequences [0, i) decode one token each)"
        check("q_len of sequence", q_lens, ~decode | (q_lens == 1), expected)
    return check.fine


# ---- adapters: each op's arguments (its full signature, public defaults) -> PagedBatch ----
#
# Options that only steer a schedule (split counts, TPU hints) or ask for the exact masking these ops
# always do (`mask_value`) are accepted and dropped here; the cores read their tiling from `cfg`.


def _rows_view(cache) -> jax.Array:
    """A cache of any layout whose last axis is the head dim, as `[rows, head_dim]` (free reshape)."""
    return cache.reshape(-1, cache.shape[-1])


def page_attention_batch(
    query, key_cache, value_cache, context_lens, block_tables, /, *, attn_scale=None, max_context_len=None,
    num_splits=0, mask_value=DEFAULT_MASK_VALUE, attn_logits_soft_cap=None, pages_per_compute_block=None,
    megacore_mode=None, inline_seq_dim=True, sliding_window=None,
) -> PagedBatch:  # fmt: skip
    """`page_attention`: one query per sequence (decode), caches `[blocks, Hkv, block_size, D]`."""
    del mask_value, pages_per_compute_block, megacore_mode, inline_seq_dim
    num_seqs, _, head_dim = query.shape
    num_blocks, num_kv_heads, block_size, _ = key_cache.shape
    capacity = block_tables.shape[1] * block_size
    capacity = capacity if max_context_len is None else min(capacity, int(max_context_len))
    return PagedBatch(
        queries=query,
        key_rows=_rows_view(key_cache),
        value_rows=_rows_view(value_cache),
        page_tables=block_tables.astype(jnp.int32),
        query_start=jnp.arange(num_seqs, dtype=jnp.int32),
        query_len=jnp.ones((num_seqs,), jnp.int32),
        kv_len=clamp_lengths(context_lens, capacity),
        static=Static(
            rows=CacheRows(block_size, num_blocks, num_kv_heads * block_size, 1, block_size),
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            softmax_scale=resolve_scale(attn_scale, head_dim, "attn_scale"),
            soft_cap=check_soft_cap(attn_logits_soft_cap, "attn_logits_soft_cap"),
            window=last_positions_window(sliding_window),
            max_kv_len=capacity,
            num_splits=int(num_splits),
        ),
    )


def prefill_batch(
    query, key_cache, value_cache, context_len, page_indices, /, *, softmax_scale=None,
    mask_value=DEFAULT_MASK_VALUE, attn_logits_soft_cap=None, sliding_window=None,
) -> PagedBatch:  # fmt: skip
    """`prefill_page_attention`: the last `chunk` positions of one sequence; caches `[Hkv, pages, page_size, D]`."""
    del mask_value
    chunk, _, head_dim = query.shape
    num_kv_heads, num_pages, page_size, _ = key_cache.shape
    return PagedBatch(
        queries=query,
        key_rows=_rows_view(key_cache),
        value_rows=_rows_view(value_cache),
        page_tables=page_indices.astype(jnp.int32)[None, :],
        query_start=jnp.zeros((1,), jnp.int32),
        query_len=jnp.full((1,), chunk, jnp.int32),
        kv_len=clamp_lengths(context_len.reshape(1), page_indices.shape[0] * page_size),
        static=Static(
            rows=CacheRows(page_size, num_pages, page_size, 1, num_pages * page_size),
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            softmax_scale=resolve_scale(softmax_scale, head_dim),
            soft_cap=check_soft_cap(attn_logits_soft_cap, "attn_logits_soft_cap"),
            window=last_positions_window(sliding_window),
            max_kv_len=page_indices.shape[0] * page_size,
        ),
    )


def clamp_lengths(kv_len, capacity: int) -> jax.Array:
    """Key lengths as int32, clamped to `[0, capacity]` (the positions of a page table row, or the op's bound)."""
    return jnp.clip(kv_len.astype(jnp.int32), 0, capacity)


def ragged_queries(query_start_loc, count, num_seqs: int, num_tokens: int):
    """`(query_start, query_len)` `[N]` int32 of cumulative bounds `query_start_loc [N + 1]`.

    The bounds are clamped to `[0, num_tokens]` and made non-decreasing (a running max), so sequences
    own disjoint token ranges; `count` is clamped to `[0, N]` and sequences from it on get no queries.
    """
    loc = lax.cummax(jnp.clip(query_start_loc.astype(jnp.int32), 0, num_tokens))
    count = jnp.clip(jnp.asarray(count, jnp.int32).reshape(-1)[0], 0, num_seqs)
    lengths = jnp.where(jnp.arange(num_seqs) < count, loc[1:] - loc[:-1], 0)
    return loc[:-1], lengths


def _interleaved_rows(num_pages: int, page_size: int, combined_heads: int) -> CacheRows:
    """Rows of a `[pages, page_size, combined heads, width]` cache holding K of head h at 2h and V at 2h + 1."""
    return CacheRows(page_size, num_pages, page_size * combined_heads, combined_heads, 2, 0, 1)


def ragged_v2_batch(
    queries, kv_pages, context_lens, block_tables, query_start_loc, num_seqs, softmax_aux=None, /, *,
    softmax_scale=None, logits_soft_cap=None, compute_dtype=jnp.bfloat16, optimized=False, sliding_window=None,
    mask_value=None, vmem_limit_bytes=None,
) -> PagedBatch:  # fmt: skip
    """`ragged_page_attention_v2`: packed queries, one cache `[pages, page_size, 2 Hkv, D]` (K even, V odd)."""
    del optimized, mask_value, vmem_limit_bytes
    _, num_heads, head_dim = queries.shape
    num_pages, page_size, combined_heads, _ = kv_pages.shape
    view = _rows_view(kv_pages)
    query_start, query_len = ragged_queries(query_start_loc, num_seqs, context_lens.shape[0], queries.shape[0])
    return PagedBatch(
        queries=queries,
        key_rows=view,
        value_rows=view,
        page_tables=block_tables.astype(jnp.int32),
        query_start=query_start,
        query_len=query_len,
        kv_len=clamp_lengths(context_lens, block_tables.shape[1] * page_size),
        sinks=fold_sinks(softmax_aux, num_heads),
        static=Static(
            rows=_interleaved_rows(num_pages, page_size, combined_heads),
            num_kv_heads=combined_heads // 2,
            head_dim=head_dim,
            softmax_scale=resolve_scale(softmax_scale, head_dim),
            soft_cap=check_soft_cap(logits_soft_cap),
            window=last_positions_window(sliding_window),
            compute_dtype=None if compute_dtype is None else jnp.dtype(compute_dtype).name,
            max_kv_len=block_tables.shape[1] * page_size,
        ),
    )


def kv_packing(dtype) -> int:
    """How many cache elements share one 32-bit word in `ragged_page_attention_v3`'s cache layout."""
    return max(1, 32 // (8 * jnp.dtype(dtype).itemsize))


def v3_cache_shape(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int, dtype) -> tuple[int, ...]:
    """`[pages, page_size, ceil(2 Hkv / packing), packing, head_dim rounded up to 128]`."""
    packing = kv_packing(dtype)
    return (num_pages, page_size, -(-2 * num_kv_heads // packing), packing, -(-head_dim // 128) * 128)


def new_token_rows(tables, kv_lens, query_start, query_len, num_tokens: int, page_size: int, num_pages: int):
    """`[T]` int32: the row, in a cache viewed as `[pages * page_size, ...]`, where each new token goes.

    Token `j` of sequence `s` (its queries are the last positions of its context; `kv_lens` clamped to
    the table) goes to position `pos = kv_lens[s] - query_len[s] + j`: row `page * page_size + pos %
    page_size` of page `tables[s, pos // page_size]`. Tokens of no sequence, positions below 0 and pages
    outside the cache get `pages * page_size`, which a scatter with `mode="drop"` drops; of tokens
    naming one row only the last keeps it (as if written in order), so the rows kept are unique.
    """
    dropped = num_pages * page_size
    token = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.clip(sorted_position(query_start + query_len, token), 0, tables.shape[0] - 1)
    offset = token - query_start[seq]
    pos = kv_lens[seq] - query_len[seq] + offset
    column = pos // page_size
    page = tables[seq, jnp.clip(column, 0, tables.shape[1] - 1)]
    valid = (offset >= 0) & (offset < query_len[seq]) & (pos >= 0) & (column < tables.shape[1])
    rows = jnp.where(valid & page_in_cache(page, num_pages), page * page_size + pos % page_size, dropped)
    order = jnp.argsort(rows, stable=True)
    ranked = rows[order]
    overwritten = (ranked == jnp.roll(ranked, -1)) & (token < num_tokens - 1)
    return rows.at[order].set(jnp.where(overwritten, dropped, ranked), unique_indices=True)


def write_kv_cache(keys, values, kv_cache, tables, kv_lens, query_start, query_len) -> jax.Array:
    """The cache of `ragged_page_attention_v3` with each sequence's new keys/values written in.

    Token `j` of sequence `s` goes to its row of `new_token_rows` (`tables [N, W]`, clamped `kv_lens`,
    the sequences' queries); kv head `h` fills combined head `2h` (key) and `2h + 1` (value), the head
    dim zero-padded. A scatter of the new rows only, so under `jit` with the cache donated the update
    happens in place.
    """
    num_tokens, num_kv_heads, head_dim = keys.shape
    num_pages, page_size, groups, packing, width = kv_cache.shape
    flat_slot = new_token_rows(tables, kv_lens, query_start, query_len, num_tokens, page_size, num_pages)
    new = jnp.stack([keys, values], axis=2).reshape(num_tokens, 2 * num_kv_heads, head_dim)
    new = jnp.pad(new, ((0, 0), (0, groups * packing - 2 * num_kv_heads), (0, width - head_dim)))
    flat = kv_cache.reshape(num_pages * page_size, groups * packing, width)
    flat = flat.at[flat_slot].set(new.astype(kv_cache.dtype), mode="drop", unique_indices=True)
    return flat.reshape(kv_cache.shape)


def quantize_queries(queries, q_scale: float, dtype) -> jax.Array:
    """`queries / q_scale` rounded to the cache's `dtype`, saturated to its range as a quantiser does (an
    overflow would be inf or NaN in float8), and kept in the queries' dtype, which the output keeps."""
    info = jnp.finfo(dtype)
    scaled = jnp.clip(queries / q_scale, float(info.min), float(info.max))
    return scaled.astype(dtype).astype(queries.dtype)


def ragged_v3_batch(
    queries, keys, values, kv_cache, kv_lens, block_tables, query_start_loc, distribution, softmax_aux=None, /, *,
    softmax_scale=1.0, sliding_window=None, logits_soft_cap=None, q_scale=None, k_scale=None, v_scale=None,
    vmem_limit_bytes=None,
) -> PagedBatch:  # fmt: skip
    """`ragged_page_attention_v3`: writes the new keys/values into the packed cache, then reads it as K/V rows.

    The updated cache is the batch's `key_rows` (reshaped back by the implementations). With `q_scale`
    the queries are quantised like the cache (`quantize_queries`) and the logits scaled back;
    `k_scale` scales the logits and `v_scale` the output (dequantised K and V).
    """
    del vmem_limit_bytes
    _, num_heads, head_dim = queries.shape
    num_pages, page_size, groups, packing, _ = kv_cache.shape
    max_seqs = kv_lens.shape[0]
    tables = block_tables.astype(jnp.int32).reshape(max_seqs, -1)
    kv_len = clamp_lengths(kv_lens, tables.shape[1] * page_size)
    query_start, query_len = ragged_queries(query_start_loc, distribution[2], max_seqs, queries.shape[0])
    kv_cache = write_kv_cache(keys, values, kv_cache, tables, kv_len, query_start, query_len)
    view = _rows_view(kv_cache)
    scale = resolve_scale(softmax_scale, head_dim)
    if q_scale is not None:
        queries = quantize_queries(queries, q_scale, kv_cache.dtype)
        scale *= float(q_scale)
    if k_scale is not None:
        scale *= float(k_scale)
    return PagedBatch(
        queries=queries,
        key_rows=view,
        value_rows=view,
        page_tables=tables,
        query_start=query_start,
        query_len=query_len,
        kv_len=kv_len,
        sinks=fold_sinks(softmax_aux, num_heads),
        static=Static(
            rows=_interleaved_rows(num_pages, page_size, groups * packing),
            num_kv_heads=keys.shape[1],
            head_dim=head_dim,
            softmax_scale=scale,
            soft_cap=check_soft_cap(logits_soft_cap),
            window=last_positions_window(sliding_window),
            value_scale=None if v_scale is None else float(v_scale),
            max_kv_len=tables.shape[1] * page_size,
        ),
    )


def ragged_decode_batch(
    query, key, value, sequence_start, sequence_end, softmax_aux=None, /, *, softmax_scale=None,
    sliding_window=None, logits_soft_cap=None,
) -> PagedBatch:  # fmt: skip
    """`ragged_decode_attention`: dense `[B, S, Hkv, D]` K/V, each row a page of its own; keys `[start, end)`."""
    batch, seq_len, num_kv_heads, head_dim = key.shape
    query = query.reshape(batch, -1, head_dim)
    end = clamp_lengths(sequence_end, seq_len)
    return PagedBatch(
        queries=query,
        key_rows=_rows_view(key),
        value_rows=_rows_view(value),
        page_tables=jnp.arange(batch, dtype=jnp.int32)[:, None],
        query_start=jnp.arange(batch, dtype=jnp.int32),
        query_len=jnp.ones((batch,), jnp.int32),
        kv_len=end,
        kv_start=jnp.clip(sequence_start.astype(jnp.int32), 0, end),
        sinks=fold_sinks(softmax_aux, query.shape[1]),
        static=Static(
            rows=CacheRows(seq_len, batch, seq_len * num_kv_heads, num_kv_heads, 1),
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            softmax_scale=resolve_scale(softmax_scale, head_dim),
            soft_cap=check_soft_cap(logits_soft_cap),
            window=decode_window(sliding_window),
            max_kv_len=seq_len,
        ),
    )


def unified_batch(
    queries, key_cache, value_cache, kv_lens, block_tables, query_start_loc, alibi_slopes=None, qq_bias=None,
    softmax_aux=None, /, *, softmax_scale=None, causal=True, sliding_window=None, logits_soft_cap=None,
    seq_threshold_3d=None,
) -> PagedBatch:  # fmt: skip
    """`unified_attention`: packed queries, caches `[blocks, block_size, Hkv, D]`, ALiBi and query-query bias."""
    del seq_threshold_3d
    _, num_heads, head_dim = queries.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    query_start, query_len = ragged_queries(query_start_loc, kv_lens.shape[0], kv_lens.shape[0], queries.shape[0])
    return PagedBatch(
        queries=queries,
        key_rows=_rows_view(key_cache),
        value_rows=_rows_view(value_cache),
        page_tables=block_tables.astype(jnp.int32),
        query_start=query_start,
        query_len=query_len,
        kv_len=clamp_lengths(kv_lens, block_tables.shape[1] * block_size),
        sinks=fold_sinks(softmax_aux, num_heads),
        alibi_slopes=alibi_slopes,
        qq_bias=qq_bias,
        static=Static(
            rows=CacheRows(block_size, num_blocks, block_size * num_kv_heads, num_kv_heads, 1),
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            softmax_scale=resolve_scale(softmax_scale, head_dim),
            soft_cap=check_soft_cap(logits_soft_cap),
            window=last_positions_window(sliding_window),
            causal=bool(causal),
            max_kv_len=block_tables.shape[1] * block_size,
        ),
    )


# ---- the shared math of every core ----


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class QueryTiles:
    """The batch's queries cut into tiles of `block_q` queries of one sequence: the cores' work rows.

    Row `r` holds queries `first[r] .. first[r] + block_q - 1` of sequence `seq[r]`; `token[r, i]` is
    the packed index of its i-th query, or `num_tokens` (out of range) past the end of its sequence.
    Rows past the last tile are not `valid` (they hold no query).
    """

    seq: jax.Array  # [R] int32, clipped to a real sequence
    first: jax.Array  # [R] int32: index of the tile's first query within its sequence
    token: jax.Array  # [R, block_q] int32
    valid: jax.Array  # [R] bool


def max_tiles(num_tokens: int, num_seqs: int, block_q: int) -> int:
    """A static bound on the tiles: every non-empty sequence wastes less than one tile."""
    return (num_tokens + min(num_seqs, num_tokens) * (block_q - 1)) // block_q


def query_tiles(batch: PagedBatch, block_q: int) -> QueryTiles:
    tiles = -(-batch.query_len // block_q)
    ends = jnp.cumsum(tiles)
    rows = jnp.arange(max_tiles(batch.num_tokens, batch.num_seqs, block_q), dtype=jnp.int32)
    seq = sorted_position(ends, rows).astype(jnp.int32)
    valid = seq < batch.num_seqs
    seq = jnp.minimum(seq, batch.num_seqs - 1)
    first = (rows - (ends[seq] - tiles[seq])) * block_q
    index = first[:, None] + jnp.arange(block_q, dtype=jnp.int32)[None, :]
    in_seq = valid[:, None] & (index < batch.query_len[seq][:, None])
    token = jnp.where(in_seq, batch.query_start[seq][:, None] + index, batch.num_tokens)
    return QueryTiles(seq=seq, first=first, token=token, valid=valid)


def key_span(st: Static, kv_len, kv_start, context, first, block_q: int, valid=None):
    """Keys `[lo, hi)` that queries `first .. first + block_q - 1` (at positions `context + first + i`) may see.

    `context` is `kv_len - q_len`; the span is empty (`hi <= lo`) when no key is allowed (or not `valid`).
    """
    q_lo = context + first
    q_hi = q_lo + block_q - 1
    hi = kv_len
    if st.causal:
        hi = jnp.minimum(hi, q_hi + 1)
    if st.window is not None:
        hi = jnp.minimum(hi, q_hi + st.window[1] + 1)
    lo = jnp.zeros_like(hi) if kv_start is None else kv_start
    if st.window is not None:
        lo = jnp.maximum(lo, q_lo - st.window[0])
    if valid is not None:
        hi = jnp.where(valid, hi, lo)
    return lo, hi


def span_bound(st: Static, block_q: int) -> int:
    """A static bound on the width `hi - lo` of any tile's key span."""
    bound = st.max_kv_len
    if st.window is not None:
        bound = min(bound, st.window[0] + st.window[1] + block_q)
    return max(bound, 0)


def tile_bias(st: Static, k_pos, context, alibi=None, qq_bias=None, q_index=None):
    """The additive bias of a logit tile, or None: ALiBi `slope * (k_pos - context)` (vLLM's form) and the
    query-query bias `qq_bias[q_index, k_pos - context]` where both indices fall inside it.

    `alibi` is the per-head slope and `q_index` the query's index within its sequence, each shaped
    to broadcast against the tile (as `k_pos - context` does).
    """
    rel = k_pos - context
    bias = None if alibi is None else alibi.astype(jnp.float32) * rel
    if qq_bias is not None:
        size = qq_bias.shape[0]
        inside = (q_index < size) & (rel >= 0) & (rel < size)
        qq = qq_bias.astype(jnp.float32)[jnp.clip(q_index, 0, size - 1), jnp.clip(rel, 0, size - 1)]
        qq = jnp.where(inside, qq, 0.0)
        bias = qq if bias is None else bias + qq
    return bias


def page_in_cache(page, num_pages: int):
    """Whether page-table entries name pages of the cache: a position on any other entry holds no key."""
    return (page >= 0) & (page < num_pages)


def adjust_logits(s, q_pos, k_pos, lo, hi, st: Static, bias=None, key_ok=None):
    """Scaled `q·k` tile -> soft cap, then `bias`, then disallowed keys at -inf.

    `q_pos`, `k_pos`, `lo`, `hi`, `bias` and `key_ok` broadcast against `s`; keys count inside `[lo, hi)`,
    where the causal / window masks allow them and where `key_ok` (their page is in the cache) holds.
    """
    if st.soft_cap is not None:
        s = st.soft_cap * jnp.tanh(s / st.soft_cap)
    if bias is not None:
        s = s + bias
    allowed = (k_pos >= lo) & (k_pos < hi)
    if key_ok is not None:
        allowed &= key_ok
    if st.causal:
        allowed &= k_pos <= q_pos
    if st.window is not None:
        allowed &= (k_pos >= q_pos - st.window[0]) & (k_pos <= q_pos + st.window[1])
    return jnp.where(allowed, s, -jnp.inf)


def online_softmax_step(carry, s, v, matmul, exp=jnp.exp, detach=jax.lax.stop_gradient):
    """One key tile into running `(acc, m, l)`: `s [..., q, k]` logits (-inf = masked), `v` its values.

    The running max is a shift the result does not depend on, so its gradient is stopped (`detach`;
    kernels, which are never differentiated, pass the identity); rows with nothing allowed yet keep
    m = -inf and are shifted by 0 (no inf - inf).
    """
    acc, m, denom = carry
    m_new = detach(jnp.maximum(m, jnp.max(s, axis=-1)))
    shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    alpha = exp(m - shift)
    p = exp(s - shift[..., None])
    return acc * alpha[..., None] + matmul(p, v), m_new, denom * alpha + jnp.sum(p, axis=-1)


def finalize(acc, m, denom, sinks, st: Static, tiles: QueryTiles, num_tokens: int, dtype):
    """Partial softmax sums of every split -> the output `[T, Hq, D]` in `dtype`.

    `acc [S, R, Bq, Hq, Dc]` and `m`, `denom` `[S, R, Bq, Hq]` (float32) are each split's unnormalised sums,
    running max and denominator per (tile row, query, head). Splits merge by their log-sum-exp; the
    sinks join the denominator only; a row with no allowed key and no sink is 0. Each tile row then
    goes to its queries' packed positions (tokens of no sequence stay 0).
    """
    m_all = jnp.max(m, axis=0)
    shift = jnp.where(m_all == -jnp.inf, 0.0, m_all)
    weight = jnp.exp(m - shift)
    l_all = jnp.sum(denom * weight, axis=0)
    acc_all = jnp.sum(acc * weight[..., None], axis=0)
    if sinks is not None:
        _, alpha, l_all = join_sink(shift, l_all, sinks, jnp.exp)
        acc_all = acc_all * alpha[..., None]
    out = acc_all / jnp.where(l_all == 0.0, 1.0, l_all)[..., None]
    if st.value_scale is not None:
        out = out * st.value_scale
    out = out[..., : st.head_dim].astype(dtype)
    placed = jnp.zeros((num_tokens, *out.shape[2:]), dtype)
    rows = out.reshape(-1, *out.shape[2:])
    return placed.at[tiles.token.reshape(-1)].set(rows, mode="drop", unique_indices=True)


# ---- what the kernels share: query tiles in, partial sums out ----

SEQ, LO, HI, CONTEXT, FIRST = range(5)  # columns of the per-tile metadata the kernels read


def tile_rows(x: jax.Array, num_kv_heads: int, rows: int) -> jax.Array:
    """`[..., Bq, Hq, X]` -> `[..., Hkv, rows, X]` with row `i * G + g` (zero rows pad up to `rows`)."""
    *lead, block_q, num_heads, tail = x.shape
    group = num_heads // num_kv_heads
    x = x.reshape(*lead, block_q, num_kv_heads, group, tail)
    x = jnp.moveaxis(x, -3, -4).reshape(*lead, num_kv_heads, block_q * group, tail)
    return jnp.pad(x, [(0, 0)] * (len(lead) + 1) + [(0, rows - block_q * group), (0, 0)])


def untile_rows(x: jax.Array, block_q: int, num_heads: int) -> jax.Array:
    """Inverse of `tile_rows` on `[..., Hkv, rows, X]` -> `[..., Bq, Hq, X]`."""
    *lead, num_kv_heads, _, tail = x.shape
    group = num_heads // num_kv_heads
    x = x[..., : block_q * group, :].reshape(*lead, num_kv_heads, block_q, group, tail)
    return jnp.moveaxis(x, -4, -3).reshape(*lead, block_q, num_heads, tail)


def prepare_tiles(batch: PagedBatch, block_q: int, rows: int, width: int):
    """What a kernel reads of its query tiles: `(tiles, meta [R, 5] int32, q [R, Hkv, rows, width], alibi)`.

    `meta` holds each tile's sequence, key span (lo, hi), context (`kv_len - q_len`) and first query;
    `q` its query rows (`tile_rows`, in the compute dtype, zero-padded to `width`); `alibi [Hkv, rows]`
    the rows' ALiBi slopes (float32) or None.
    """
    st = batch.static
    num_tokens, num_heads, _ = batch.queries.shape
    compute = jnp.dtype(st.compute_dtype) if st.compute_dtype is not None else batch.queries.dtype
    tiles = query_tiles(batch, block_q)
    seq = tiles.seq
    context = batch.kv_len[seq] - batch.query_len[seq]
    kv_start = None if batch.kv_start is None else batch.kv_start[seq]
    lo, hi = key_span(st, batch.kv_len[seq], kv_start, context, tiles.first, block_q, tiles.valid)
    meta = jnp.stack([seq, lo, hi, context, tiles.first], axis=1).astype(jnp.int32)
    padded = jnp.concatenate([batch.queries, jnp.zeros((1, *batch.queries.shape[1:]), batch.queries.dtype)])
    q = padded[jnp.minimum(tiles.token, num_tokens)].astype(compute)  # [R, Bq, Hq, D]
    q = jnp.pad(q, ((0, 0), (0, 0), (0, 0), (0, width - st.head_dim)))
    alibi = None
    if batch.alibi_slopes is not None:
        slopes = jnp.broadcast_to(batch.alibi_slopes.astype(jnp.float32)[:, None], (block_q, num_heads, 1))
        alibi = tile_rows(slopes, st.num_kv_heads, rows)[..., 0]
    return tiles, meta, tile_rows(q, st.num_kv_heads, rows), alibi


def finish_tiles(batch: PagedBatch, tiles: QueryTiles, block_q: int, acc, m, denom) -> jax.Array:
    """A kernel's per-split partial sums in tile rows (`acc [S, R, Hkv, rows, W]`, `m`, `denom`) -> `[T, Hq, D]`."""
    acc = untile_rows(acc, block_q, batch.num_heads)
    m, denom = (untile_rows(x[..., None], block_q, batch.num_heads)[..., 0] for x in (m, denom))
    return finalize(acc, m, denom, batch.sinks, batch.static, tiles, batch.num_tokens, batch.queries.dtype)


# ---- each op's implementation: its adapter's signature around a platform's core ----


def _same(out, batch, args):
    return out


def _with_cache(out, batch, args):
    return out, batch.key_rows.reshape(args[3].shape)


def _query_rank(out, batch, args):
    return out.reshape(args[0].shape)


ADAPTERS = {
    "page_attention": (page_attention_batch, _same),
    "prefill_page_attention": (prefill_batch, _same),
    "ragged_page_attention_v2": (ragged_v2_batch, _same),
    "ragged_page_attention_v3": (ragged_v3_batch, _with_cache),
    "ragged_decode_attention": (ragged_decode_batch, _query_rank),
    "unified_attention": (unified_batch, _same),
}
"""Algorithm -> (adapter to a PagedBatch, what makes the op's result of the core's `[T, Hq, D]` output)."""


def implementation(algorithm: str, core, name: str):
    """Op `algorithm` as platform `core(batch, cfg) -> [T, Hq, D]` serves it, called as users call the op.

    The result takes the adapter's signature (tensors positional, options keyword with the public
    function's defaults) plus `cfg=None` (the implementation's own tiling), and is jitted with the
    options static, so an eager call compiles once. It trusts its arguments: the public functions in
    `ejkernel.modules` check them.
    """
    adapter, finish = ADAPTERS[algorithm]
    signature = inspect.signature(adapter)
    options = [p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]

    @functools.partial(jax.jit, static_argnames=[*options, "cfg"])
    def run(*args, cfg=None, **options):
        batch = adapter(*args, **options)
        return finish(core(batch, cfg), batch, args)

    def impl(*args, cfg=None, **options):
        return run(*args, cfg=cfg, **options)

    cfg = inspect.Parameter("cfg", inspect.Parameter.KEYWORD_ONLY, default=None)
    impl.__signature__ = signature.replace(
        parameters=[*signature.parameters.values(), cfg], return_annotation=inspect.Signature.empty
    )
    impl.__doc__ = adapter.__doc__
    impl.__name__ = impl.__qualname__ = name
    return impl


@dataclasses.dataclass(frozen=True)
class ConfigTiling:
    """The tiling a serving op's config asks for (None: the kernel's default)."""

    block_q: int | None = None
    block_k: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    num_splits: int | None = None


def config_tiling(cfg, page_size: int) -> ConfigTiling:
    """`cfg`'s tiling: its `fwd_params` and `num_splits`, else upstream's knobs on the config
    (`num_queries_per_block`, `num_kv_pages_per_block` pages of `page_size` keys per step, `num_warps`,
    `num_stages`, `num_par_softmax_segments`), block sizes rounded up to the powers of two the kernels tile by."""
    params = getattr(cfg, "fwd_params", None)

    def pick(ours: str, upstream: str, scale: int = 1, pow2: bool = True) -> int | None:
        value = getattr(params, ours, None)
        if value is None and getattr(cfg, upstream, None) is not None:
            value = getattr(cfg, upstream) * scale
            value = 1 << (value - 1).bit_length() if pow2 else value
        return value

    splits = getattr(cfg, "num_splits", None) or getattr(cfg, "num_par_softmax_segments", None)
    return ConfigTiling(
        block_q=pick("block_q", "num_queries_per_block"),
        block_k=pick("block_k", "num_kv_pages_per_block", page_size),
        num_warps=pick("num_warps", "num_warps"),
        num_stages=pick("num_stages", "num_stages", pow2=False),
        num_splits=splits,
    )
