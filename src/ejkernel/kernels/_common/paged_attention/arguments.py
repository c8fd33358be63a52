"""The argument checks of the serving ops' public functions: shapes, dtypes, options and index values.

Index values are checked through `ejkernel.kernels._common.checks` (outside `jit`, and under it with
`EJKERNEL_CHECKS=1`); each check names the op's argument and what it must be.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ejkernel.kernels._common.checks import check_values, checks_enabled, is_traced, require_float
from ejkernel.kernels._common.paged_attention.problem import page_in_cache

DEFAULT_MASK_VALUE = -2.381976426469702e38
# A mask value at or below this is "minus infinity" for every logit these ops produce: masked keys are
# always excluded exactly, so a mask value above it (which would give masked keys weight) is refused.
MASK_VALUE_LIMIT = -1e4


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


QUANTIZED_CACHES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2), jnp.dtype(jnp.int8))
"""Cache dtypes that may carry per-token-head scales (int8 only with them)."""


def check_cache_dtypes(query_name: str, query, cache_names: str, *caches) -> None:
    """The caches share a dtype, and the query's unless they are quantised (read as stored, converted in the
    query's dtype)."""
    if jnp.dtype(caches[0].dtype) in QUANTIZED_CACHES:
        check_same_dtype(cache_names, *caches)
    else:
        check_same_dtype(f"{query_name}{', ' if len(caches) > 1 else ' and '}{cache_names}", query, *caches)


def check_cache_scales(cache_name: str, cache, scales_name: str, scales) -> None:
    """Per-token-head scales of a quantised cache: float32 of the cache's shape without its last axis. An int8
    cache needs them; a 16/32-bit cache refuses them."""
    dtype = jnp.dtype(cache.dtype)
    if scales is None:
        if jnp.issubdtype(dtype, jnp.integer):
            raise TypeError(f"{cache_name} is {dtype}: pass {scales_name} (its per-token-head scales)")
        return
    if dtype not in QUANTIZED_CACHES:
        raise TypeError(f"{scales_name} is for float8/int8 caches, {cache_name} is {dtype}")
    if jnp.dtype(scales.dtype) != jnp.float32:
        raise TypeError(f"{scales_name} must be float32, got {scales.dtype}")
    check_shape(scales_name, scales, tuple(cache.shape[:-1]), f"{cache_name}'s shape without its last axis")


def check_scale_pair(key_name: str, key_scales, value_name: str, value_scales) -> None:
    """Separate K and V caches take their scales together."""
    if (key_scales is None) != (value_scales is None):
        raise ValueError(f"{key_name} and {value_name} go together, got only one of them")


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
    require_float(name, sinks)
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
