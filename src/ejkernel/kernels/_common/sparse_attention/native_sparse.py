"""Native sparse attention, what every platform shares: the packing of sequences (`cu_seqlens`), the
compressed keys and values (block means), the compressed branch, the choice of blocks from its scores,
the clean-up of the selected block lists every implementation iterates, the sliding-window branch and
the gating of the branches."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.kernels._common.checks import is_traced


class Packing(NamedTuple):
    """Where every token of `[B, S]` rows sits: its sequence's first token, its position in the sequence,
    and its place among the compressed blocks (the complete blocks of every sequence, in order)."""

    start: jax.Array  # [B, S] int32
    position: jax.Array  # [B, S] int32
    length: jax.Array  # [B, S] int32: the length of the token's sequence
    cmp_first: jax.Array  # [B, S] int32: the first compressed block of the token's sequence
    cmp_slot: jax.Array  # [B, S] int32: the compressed block holding the token (num_cmp if incomplete)
    num_cmp: int  # compressed blocks per row (static bound)
    block_size: int


def packing(batch: int, seq_len: int, block_size: int, cu_seqlens=None) -> Packing:
    """The packing of `[B, S]` rows: one sequence per row, or the sequences `cu_seqlens` packs into row 0.

    numpy arrays when `cu_seqlens` is concrete (or None), so that indices can be checked before tracing;
    numpy rather than JAX evaluated eagerly, which fails inside `shard_map` under `jax.set_mesh`."""
    xp = jnp if is_traced(cu_seqlens) else np
    t = xp.arange(seq_len, dtype=np.int32)
    if cu_seqlens is None:
        start = xp.zeros((batch, seq_len), np.int32)
        length = xp.full((batch, seq_len), seq_len, np.int32)
        cmp_first = start
    else:
        cu = xp.asarray(cu_seqlens).astype(np.int32)
        seq = xp.searchsorted(cu[1:], t, side="right")
        firsts = xp.concatenate([xp.zeros(1, np.int32), xp.cumsum((cu[1:] - cu[:-1]) // block_size)]).astype(np.int32)
        start, length, cmp_first = cu[seq][None], (cu[seq + 1] - cu[seq])[None], firsts[seq][None]
    position = t - start
    num_cmp = seq_len // block_size
    block = position // block_size
    cmp_slot = xp.where(block < length // block_size, cmp_first + block, num_cmp).astype(np.int32)
    return Packing(start, position, length, cmp_first, cmp_slot, num_cmp, block_size)


def compress(x, pack: Packing):
    """Mean of every complete block of `x [B, S, Hkv, D]`: `[B, num_cmp, Hkv, D]`."""
    rows = jnp.arange(x.shape[0])[:, None]
    sums = jnp.zeros((x.shape[0], pack.num_cmp, *x.shape[2:]), jnp.float32)
    sums = sums.at[rows, pack.cmp_slot].add(x.astype(jnp.float32), mode="drop")
    return sums / pack.block_size


def compressed_attention(q, k_cmp, v_cmp, pack: Packing, softmax_scale: float):
    """The compressed branch: `q [B, S, H, D]` over the block means; query t sees the complete blocks of
    its sequence that end at or before it. Returns (out [B, S, H, Dv] float32, probabilities
    [B, S, Hkv, G, num_cmp]); a query that sees no block gets zeros."""
    batch, seq_len, heads, dim = q.shape
    kv_heads = k_cmp.shape[2]
    q = q.reshape(batch, seq_len, kv_heads, heads // kv_heads, dim)
    s = jnp.einsum("btkgd,bckd->btkgc", q, k_cmp.astype(q.dtype), preferred_element_type=jnp.float32)
    c = jnp.arange(pack.num_cmp)
    first = pack.cmp_first[..., None]
    seen = ((c >= first) & (c < first + (pack.position[..., None] + 1) // pack.block_size))[:, :, None, None]
    s = jnp.where(seen, s * jnp.float32(softmax_scale), -jnp.inf)
    row_max = jnp.max(s, axis=-1, keepdims=True, initial=-jnp.inf)
    e = jnp.exp(s - jax.lax.stop_gradient(jnp.where(row_max == -jnp.inf, 0.0, row_max)))
    denom = jnp.sum(e, axis=-1, keepdims=True)
    p = e / jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("btkgc,bckd->btkgd", p, v_cmp, preferred_element_type=jnp.float32)
    return out.reshape(batch, seq_len, heads, -1), p


def select_blocks(probabilities, pack: Packing, num_selected: int):
    """Top `num_selected` blocks per token and key/value head, ranked by compressed probability summed over
    the head's query heads: `[B, S, Hkv, n]` block indices within the sequence, -1 where fewer exist.

    The query's own block ranks first and later blocks never rank; ties go to the lower index.
    """
    seq_len, bs = pack.position.shape[1], pack.block_size
    importance = jax.lax.stop_gradient(jnp.sum(probabilities, axis=3))  # [B, S, Hkv, num_cmp]
    blocks = jnp.arange(-(-seq_len // bs))
    own = (pack.position // bs)[..., None]
    if pack.num_cmp:
        slots = jnp.clip(pack.cmp_first[..., None] + blocks, 0, pack.num_cmp - 1)
        slots = jnp.broadcast_to(slots[:, :, None], (*importance.shape[:3], blocks.shape[0]))
        earlier = jnp.take_along_axis(importance, slots, axis=-1)
    else:
        earlier = jnp.zeros((*importance.shape[:3], blocks.shape[0]), jnp.float32)
    own = own[:, :, None]
    ranked = jnp.where(blocks == own, jnp.inf, jnp.where(blocks < own, earlier, -jnp.inf))
    values, indices = jax.lax.top_k(ranked, min(num_selected, blocks.shape[0]))
    return jnp.where(values == -jnp.inf, -1, indices).astype(jnp.int32)


def clean_selection(block_indices, block_counts, pack: Packing):
    """The listed blocks every implementation visits: `[B, S, Hkv, n]` with -1 for entries past the count,
    for blocks after the query's own (no key there is visible) and for repeats of an earlier entry.

    Concrete indices outside `[-1, blocks of the sequence)` raise ValueError.
    """
    idx = jnp.asarray(block_indices).astype(jnp.int32)
    own = (pack.position // pack.block_size)[..., None, None]
    if not is_traced(idx, pack.length):
        values, blocks = np.asarray(idx), -(-np.asarray(pack.length)[..., None, None] // pack.block_size)
        if (values < -1).any() or (values >= blocks).any():
            raise ValueError(
                "block_indices must lie in [-1, blocks of the token's sequence) (-1 lists nothing), got values "
                f"from {int(values.min())} to {int(values.max())} for sequences of up to {int(blocks.max())} blocks"
            )
    n = idx.shape[-1]
    counts = jnp.broadcast_to(jnp.asarray(block_counts, jnp.int32), idx.shape[:3])[..., None]
    ok = (idx >= 0) & (jnp.arange(n) < counts) & (idx <= own)
    earlier = jnp.tril(jnp.ones((n, n), bool), -1)
    repeat = jnp.any((idx[..., :, None] == idx[..., None, :]) & ok[..., None, :] & earlier, axis=-1)
    return jnp.where(ok & ~repeat, idx, -1)


class SparseSelection(NamedTuple):
    """A checked native sparse attention call, up to its selected branch: what every platform shares."""

    pack: Packing
    indices: jax.Array  # [B, S, Hkv, n] int32: blocks to visit (cleaned: -1 where nothing)
    compressed: jax.Array | None  # [B, S, H, Dv] float32: the compressed branch, where g_cmp asks for it
    softmax_scale: float


def _check_native_args(
    query, key, value, g_cmp, g_slc, block_indices, block_counts, cu_seqlens, block_size, g_swa, window_size
):
    for name, x in (("query", query), ("key", key), ("value", value)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name} must be [batch, seq, heads, dim], got shape {getattr(x, 'shape', None)}")
    batch, seq_len, heads, dim = query.shape
    kv_heads = key.shape[2]
    if key.shape[:2] != (batch, seq_len) or value.shape[:3] != key.shape[:3] or key.shape[3] != dim:
        raise ValueError(
            f"key and value must be [batch={batch}, seq={seq_len}, kv_heads, dim={dim}] (value: any last dim), "
            f"got key {key.shape}, value {value.shape}"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({kv_heads})")
    for name, g in (("g_cmp", g_cmp), ("g_slc", g_slc), ("g_swa", g_swa)):
        if g is not None and g.shape != (batch, seq_len, heads):
            raise ValueError(f"{name} must be [batch, seq, heads] = {(batch, seq_len, heads)}, got {g.shape}")
    if not isinstance(window_size, int) or isinstance(window_size, bool) or window_size < 0:
        raise ValueError(f"window_size must be a non-negative int, got {window_size!r}")
    if (g_swa is None) != (window_size == 0):
        raise ValueError(
            f"the sliding-window branch needs both g_swa and window_size > 0, got g_swa "
            f"{'None' if g_swa is None else 'given'} and window_size={window_size}"
        )
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if block_indices is not None:
        if not jnp.issubdtype(block_indices.dtype, jnp.integer):
            raise TypeError(f"block_indices must hold integers, got dtype {block_indices.dtype}")
        if block_indices.ndim != 4 or block_indices.shape[:3] != (batch, seq_len, kv_heads):
            raise ValueError(
                f"block_indices must be [batch, seq, kv_heads, n] = ({batch}, {seq_len}, {kv_heads}, n), "
                f"got {block_indices.shape}"
            )
    if isinstance(block_counts, int | np.integer) and not isinstance(block_counts, bool):
        if block_counts < 0:
            raise ValueError(f"block_counts must be non-negative, got {block_counts}")
    else:
        counts = jnp.asarray(block_counts)
        if not jnp.issubdtype(counts.dtype, jnp.integer):
            raise TypeError(f"block_counts must be an int or an integer array, got dtype {counts.dtype}")
        if counts.shape != (batch, seq_len, kv_heads):
            raise ValueError(
                f"block_counts must be [batch, seq, kv_heads] = {(batch, seq_len, kv_heads)}, got {counts.shape}"
            )
        if not is_traced(counts) and (np.asarray(counts) < 0).any():
            raise ValueError(f"block_counts must be non-negative, got {int(np.asarray(counts).min())}")
    if cu_seqlens is not None:
        if not jnp.issubdtype(cu_seqlens.dtype, jnp.integer) or cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2:
            raise ValueError(f"cu_seqlens must be 1-D integer bounds [0, n1, n1+n2, ...], got {cu_seqlens.shape}")
        if batch != 1:
            raise ValueError(f"with cu_seqlens the sequences are packed into one row: batch must be 1, got {batch}")
        if not is_traced(cu_seqlens):
            cu = np.asarray(cu_seqlens)
            if cu[0] != 0 or (np.diff(cu) < 0).any() or cu[-1] != seq_len:
                raise ValueError(f"cu_seqlens must rise from 0 to seq={seq_len}, got {cu.tolist()}")


def native_selection(
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
    softmax_scale=None,
    window_size: int = 0,
    block_size: int = 64,
) -> SparseSelection:
    """Checks a native sparse attention call and computes what precedes its selected branch.

    The compressed branch (plain jnp, differentiated by JAX) runs when `g_cmp` asks for its output or
    when no `block_indices` are given (they are then chosen from its probabilities).
    """
    _check_native_args(
        query, key, value, g_cmp, g_slc, block_indices, block_counts, cu_seqlens, block_size, g_swa, window_size
    )
    batch, seq_len, _, dim = query.shape
    scale = float(dim**-0.5 if softmax_scale is None else softmax_scale)
    pack = packing(batch, seq_len, block_size, cu_seqlens)
    compressed = None
    if g_cmp is not None or block_indices is None:
        k_cmp, v_cmp = compress(key, pack), compress(value, pack)
        compressed, probabilities = compressed_attention(query, k_cmp, v_cmp, pack, scale)
        if block_indices is None:
            blocks = -(-seq_len // block_size)
            fixed = isinstance(block_counts, int | np.integer)
            block_indices = select_blocks(
                probabilities, pack, max(1, min(int(block_counts), blocks)) if fixed else blocks
            )
    indices = clean_selection(block_indices, block_counts, pack)
    return SparseSelection(pack, indices, compressed if g_cmp is not None else None, scale)


def sliding_branch(attend, query, key, value, cu_seqlens, pack: Packing, window_size: int, softmax_scale: float):
    """NSA's sliding-window branch `[B, S, H, Dv]`: query t attends the keys t - window_size < s <= t of its
    sequence, through `attend`, a platform's block-sparse attention (`[B, H, S, D]` layout), whose cost
    follows the window.

    Packed, a sequence's first token names its segment; the ids go in as a JAX array, as the kernels
    index them with traced block numbers (the packing is numpy when `cu_seqlens` is concrete)."""
    segments = None if cu_seqlens is None else jnp.asarray(pack.start)
    out = attend(
        *(jnp.swapaxes(x, 1, 2) for x in (query, key, value)),
        causal=True,
        sliding_window=(window_size - 1, 0),
        softmax_scale=softmax_scale,
        q_segment_ids=segments,
        kv_segment_ids=segments,
    )
    return jnp.swapaxes(out, 1, 2)


def gate_branches(selected, g_slc, compressed, g_cmp, dtype, sliding=None, g_swa=None):
    """`g_slc · selected + g_cmp · compressed + g_swa · sliding` (each gate optional; no compressed branch
    without `g_cmp`, no sliding branch without `g_swa`)."""
    out = selected.astype(jnp.float32)
    if g_slc is not None:
        out = out * g_slc[..., None].astype(jnp.float32)
    if g_cmp is not None:
        out = out + compressed * g_cmp[..., None].astype(jnp.float32)
    if g_swa is not None:
        out = out + sliding.astype(jnp.float32) * g_swa[..., None].astype(jnp.float32)
    return out.astype(dtype)
