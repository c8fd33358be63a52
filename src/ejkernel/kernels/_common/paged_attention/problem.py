"""The canonical problem of the serving ops: one ragged, paged attention batch that every core reads.

The caches are viewed as 2-D `[rows, head_dim]` arrays (a free reshape of every layout), and `CacheRows`
says where the row of (page, slot, kv head) is: one addressing rule for all six layouts. Per sequence the
batch holds query start and length, key length, first valid key (`kv_start`, only the dense
`ragged_decode_attention` has one) and its page-table row. A position whose page-table entry is not a
page of the cache holds no key (`page_in_cache`).
"""

from __future__ import annotations

import dataclasses

import jax


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
class PagedStatic:
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
    None; alibi_slopes `[Hq]` or None; qq_bias `[Tq, Tq]` or None; key_scales / value_scales `[rows]`
    float32 or None: a quantised cache's per-row scales (row `i` dequantises as `rows[i] * scales[i]`),
    addressed like the rows they scale.
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
    key_scales: jax.Array | None = None
    value_scales: jax.Array | None = None
    static: PagedStatic = dataclasses.field(metadata=dict(static=True), default=None)

    @property
    def num_tokens(self) -> int:
        return self.queries.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.page_tables.shape[0]

    @property
    def num_heads(self) -> int:
        return self.queries.shape[1]


def page_in_cache(page, num_pages: int):
    """Whether page-table entries name pages of the cache: a position on any other entry holds no key."""
    return (page >= 0) & (page < num_pages)
