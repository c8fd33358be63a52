"""The math every serving core shares: query tiles, key spans, logit biases and masks, the online softmax
step and the merge of per-split partial sums with the sinks (`finalize`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.attention import join_sink
from ejkernel.kernels._common.paged_attention.problem import PagedBatch, PagedStatic
from ejkernel.kernels._common.search import sorted_position


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagedQueryTiles:
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


def query_tiles(batch: PagedBatch, block_q: int, num_tiles: int | None = None) -> PagedQueryTiles:
    """The batch's tiles of `block_q` queries; `num_tiles`: a smaller static bound on them than `max_tiles`
    (the caller's promise, e.g. one tile per sequence when no sequence has more than `block_q` queries)."""
    tiles = -(-batch.query_len // block_q)
    ends = jnp.cumsum(tiles)
    bound = max_tiles(batch.num_tokens, batch.num_seqs, block_q)
    rows = jnp.arange(bound if num_tiles is None else min(bound, num_tiles), dtype=jnp.int32)
    seq = sorted_position(ends, rows).astype(jnp.int32)
    valid = seq < batch.num_seqs
    seq = jnp.minimum(seq, batch.num_seqs - 1)
    first = (rows - (ends[seq] - tiles[seq])) * block_q
    index = first[:, None] + jnp.arange(block_q, dtype=jnp.int32)[None, :]
    in_seq = valid[:, None] & (index < batch.query_len[seq][:, None])
    token = jnp.where(in_seq, batch.query_start[seq][:, None] + index, batch.num_tokens)
    return PagedQueryTiles(seq=seq, first=first, token=token, valid=valid)


def key_span(st: PagedStatic, kv_len, kv_start, context, first, block_q: int, valid=None):
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


def span_bound(st: PagedStatic, block_q: int) -> int:
    """A static bound on the width `hi - lo` of any tile's key span."""
    bound = st.max_kv_len
    if st.window is not None:
        bound = min(bound, st.window[0] + st.window[1] + block_q)
    return max(bound, 0)


def tile_bias(st: PagedStatic, k_pos, context, alibi=None, qq_bias=None, q_index=None):
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


def adjust_logits(s, q_pos, k_pos, lo, hi, st: PagedStatic, bias=None, key_ok=None):
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


def online_softmax_step(carry, s, weigh_values, exp=jnp.exp, detach=jax.lax.stop_gradient):
    """One key tile into running `(acc, m, l)`: `s [..., q, k]` logits (-inf = masked); `weigh_values(p)` is the
    probabilities times the tile's values, `p @ v` (a kernel may read the values there, after the softmax).

    The running max is a shift the result does not depend on, so its gradient is stopped (`detach`;
    kernels, which are never differentiated, pass the identity); rows with nothing allowed yet keep
    m = -inf and are shifted by 0 (no inf - inf).
    """
    acc, m, denom = carry
    m_new = detach(jnp.maximum(m, jnp.max(s, axis=-1)))
    shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    alpha = exp(m - shift)
    p = exp(s - shift[..., None])
    return acc * alpha[..., None] + weigh_values(p), m_new, denom * alpha + jnp.sum(p, axis=-1)


def finalize(
    acc, m, denom, sinks, st: PagedStatic, tiles: PagedQueryTiles, num_tokens: int, dtype, with_lse: bool = False
):
    """Partial softmax sums of every split -> the output `[T, Hq, D]` in `dtype` (`with_lse`: and its log-sum-exp).

    `acc [S, R, Bq, Hq, Dc]` and `m`, `denom` `[S, R, Bq, Hq]` (float32) are each split's unnormalised sums,
    running max and denominator per (tile row, query, head). Splits merge by their log-sum-exp; the
    sinks join the denominator only; a row with no allowed key and no sink is 0. Each tile row then
    goes to its queries' packed positions (tokens of no sequence stay 0). The log-sum-exp `[T, Hq]`
    float32 is the natural log of each row's softmax denominator, sinks included: -inf for a row with
    neither a key nor a sink and for tokens of no sequence (what `merge_attention_states` expects).
    """
    m_all = jnp.max(m, axis=0)
    shift = jnp.where(m_all == -jnp.inf, 0.0, m_all)
    weight = jnp.exp(m - shift)
    l_all = jnp.sum(denom * weight, axis=0)
    acc_all = jnp.sum(acc * weight[..., None], axis=0)
    if sinks is not None:
        shift, alpha, l_all = join_sink(shift, l_all, sinks, jnp.exp)
        acc_all = acc_all * alpha[..., None]
    out = acc_all / jnp.where(l_all == 0.0, 1.0, l_all)[..., None]
    if st.value_scale is not None:
        out = out * st.value_scale
    out = out[..., : st.head_dim].astype(dtype)

    def place(rows, fill):
        """Tile rows `[R, Bq, ...]` -> packed tokens `[T, ...]`, `fill` where no query lands."""
        packed = jnp.full((num_tokens, *rows.shape[2:]), fill, rows.dtype)
        rows = rows.reshape(-1, *rows.shape[2:])
        return packed.at[tiles.token.reshape(-1)].set(rows, mode="drop", unique_indices=True)

    if not with_lse:
        return place(out, 0)
    empty = l_all == 0.0
    lse = jnp.where(empty, -jnp.inf, shift + jnp.log(jnp.where(empty, 1.0, l_all)))
    return place(out, 0), place(lse, -jnp.inf)
