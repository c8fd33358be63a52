"""The block table of a block-sparse mask, built once per call: per query block, the key blocks holding at
least one allowed pair (and whether the tile needs its token mask), and the transposed lists per key
block. Kernels iterate the lists; an empty block is never visited."""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.kernels._common.checks import is_traced
from ejkernel.kernels._common.sparse_attention.masks import SparseMask


@dataclasses.dataclass(frozen=True)
class BlockTable:
    """Which tiles of one tiling hold allowed pairs, as lists that kernels iterate.

    Per query block (forward, dQ): `kv_blocks [Bt, Ht, nQ, Wk]` the key blocks holding an allowed
    pair, `kv_counts [Bt, Ht, nQ]` how many there are (entries past the count repeat the last one, so
    a prefetch stays in range) and `kv_edges [Bt, Ht, nQ]` how many of them, listed first, mix allowed
    and masked pairs; the full tiles after them need no token mask. Each run is ascending. Per key
    block (dK, dV): the same with `q_`.
    `Bt`/`Ht` are 1 where the mask is the same for every batch row / head. `needs_dense_mask` is
    False when the dense mask is constant on every tile, so that the lists alone say it.
    """

    kv_blocks: jax.Array
    kv_counts: jax.Array
    kv_edges: jax.Array
    q_blocks: jax.Array
    q_counts: jax.Array
    q_edges: jax.Array
    block_q: int
    block_k: int
    needs_dense_mask: bool

    @property
    def num_q_blocks(self) -> int:
        return self.kv_blocks.shape[2]

    @property
    def num_k_blocks(self) -> int:
        return self.q_blocks.shape[2]


jax.tree_util.register_dataclass(
    BlockTable,
    data_fields=["kv_blocks", "kv_counts", "kv_edges", "q_blocks", "q_counts", "q_edges"],
    meta_fields=["block_q", "block_k", "needs_dense_mask"],
)


def row_intervals(q_len: int, kv_len: int, causal: bool, window, chunk_size) -> tuple[np.ndarray, np.ndarray]:
    """Per query row, the keys `[lo, hi)` the positional rules allow (each rule allows an interval)."""
    i = np.arange(q_len, dtype=np.int64)
    lo, hi = np.zeros_like(i), np.full_like(i, kv_len)
    if causal:
        hi = np.minimum(hi, i + 1)
    if window is not None:
        lo, hi = np.maximum(lo, i - window[0]), np.minimum(hi, i + window[1] + 1)
    if chunk_size is not None:
        start = i // chunk_size * chunk_size
        lo, hi = np.maximum(lo, start), np.minimum(hi, start + chunk_size)
    return lo, np.maximum(hi, lo)


def _positional_blocks(q_len, kv_len, block_q, block_k, mask: SparseMask):
    """(any, all) [nQ, nK] of the positional rules, in numpy: which tiles hold allowed pairs / only those."""
    lo, hi = row_intervals(q_len, kv_len, mask.causal, mask.sliding_window, mask.chunk_size)
    n_q, n_k = -(-q_len // block_q), -(-kv_len // block_k)
    rows = n_q * block_q
    valid = np.arange(rows) < q_len
    lo = np.pad(lo, (0, rows - q_len)).reshape(n_q, block_q, 1)
    hi = np.pad(hi, (0, rows - q_len)).reshape(n_q, block_q, 1)
    valid = valid.reshape(n_q, block_q, 1)
    k0 = np.arange(n_k) * block_k
    k1 = np.minimum(k0 + block_k, kv_len)
    hit = (np.maximum(lo, k0) < np.minimum(hi, k1)) & valid
    covers = ((lo <= k0) & (hi >= k0 + block_k) & (k0 + block_k <= kv_len)) | ~valid
    return hit.any(axis=1), covers.all(axis=1)


@functools.partial(jax.jit, static_argnames=("q_len", "kv_len", "block_q", "block_k"))
def _dense_blocks(lo, hi, q_seg, kv_seg, dense, *, q_len, kv_len, block_q, block_k):
    """(any, all, dense uniform on every tile) of the whole token mask, reduced tile by tile."""
    n_q, n_k = -(-q_len // block_q), -(-kv_len // block_k)
    rows, cols = n_q * block_q, n_k * block_k
    j = jnp.arange(cols, dtype=jnp.int32)[None, :]
    allowed = ((j >= lo[:, None]) & (j < hi[:, None]))[None, None]  # [1, 1, rows, cols]
    if q_seg is not None:
        qs = jnp.pad(q_seg, ((0, 0), (0, rows - q_len)), constant_values=-1)[:, None, :, None]
        ks = jnp.pad(kv_seg, ((0, 0), (0, cols - kv_len)), constant_values=-1)[:, None, None, :]
        allowed = allowed & (qs == ks) & (qs >= 0)
    uniform = True
    if dense is not None:
        dense = jnp.pad(dense, ((0, 0), (0, 0), (0, rows - q_len), (0, cols - kv_len)))
        allowed = allowed & dense
        inside = (jnp.arange(rows)[:, None] < q_len) & (j < kv_len)
        tiles = lambda x: x.reshape(*x.shape[:2], n_q, block_q, n_k, block_k)
        uniform = jnp.all(tiles(dense & inside).any((3, 5)) == tiles(dense | ~inside).all((3, 5)))
    pad_rows = (jnp.arange(rows) >= q_len)[:, None]
    shape = (*allowed.shape[:2], n_q, block_q, n_k, block_k)
    hit = (allowed & ~pad_rows).reshape(shape).any((3, 5))
    covers = (allowed | pad_rows).reshape(shape).all((3, 5))
    return hit, covers, uniform


def _list_rows(xp, hit, covers, width: int):
    """Lists of the hit columns of every row of `[..., rows, cols]` tiles: (indices, counts, edges).

    The partial tiles come first (`edges` of them), then the full ones, each run ascending.
    """
    partial = hit & ~covers
    counts, edges = hit.sum(-1).astype(np.int32), partial.sum(-1).astype(np.int32)
    rank = xp.where(partial, 0, xp.where(hit, 1, 2))
    order = xp.argsort(rank, axis=-1, stable=True).astype(np.int32)[..., :width]
    last = xp.take_along_axis(order, xp.clip(counts - 1, 0, width - 1)[..., None], axis=-1)
    return xp.where(xp.arange(width) < counts[..., None], order, last), counts, edges


_list_rows_jit = jax.jit(functools.partial(_list_rows, jnp), static_argnames="width")


def _lists(hit, covers, width: int | None):
    """`_list_rows` with lists as long as the longest one when `width` is None (the counts are then read)."""
    if isinstance(hit, np.ndarray):
        return _list_rows(np, hit, covers, width or max(1, int(hit.sum(-1).max())))
    if width is None:
        width = max(1, int(np.asarray(hit).sum(-1).max()))
    return _list_rows_jit(hit, covers, width=width)


def build_block_table(mask: SparseMask, *, q_len: int, kv_len: int, block_q: int, block_k: int) -> BlockTable:
    """The block table of `mask` for `block_q x block_k` tiles.

    Positional rules alone are evaluated in numpy while tracing (a constant table); with segment
    ids or a dense mask the whole token mask is reduced tile by tile, eagerly when those arrays are
    concrete (then the lists are as long as the longest one), else inside the traced program (lists
    as long as the number of blocks; loops still stop at each count). A concrete dense mask that
    is constant on every tile is said by the lists alone (`needs_dense_mask` False).
    """
    if mask.q_segment_ids is None and mask.attention_mask is None:
        hit, covers = _positional_blocks(q_len, kv_len, block_q, block_k, mask)
        hit, covers, uniform, concrete = hit[None, None], covers[None, None], True, True
    else:
        concrete = not is_traced(mask.q_segment_ids, mask.kv_segment_ids, mask.attention_mask)
        lo, hi = row_intervals(q_len, kv_len, mask.causal, mask.sliding_window, mask.chunk_size)
        pad = -(-q_len // block_q) * block_q - q_len
        lo, hi = (np.pad(x, (0, pad)).astype(np.int32) for x in (lo, hi))  # numpy: constants even under jit
        with jax.ensure_compile_time_eval() if concrete else contextlib.nullcontext():
            hit, covers, uniform = _dense_blocks(
                lo,
                hi,
                mask.q_segment_ids,
                mask.kv_segment_ids,
                mask.attention_mask,
                q_len=q_len,
                kv_len=kv_len,
                block_q=block_q,
                block_k=block_k,
            )
    with jax.ensure_compile_time_eval() if concrete else contextlib.nullcontext():
        kv = _lists(hit, covers, None if concrete else hit.shape[-1])
        q = _lists(hit.swapaxes(-1, -2), covers.swapaxes(-1, -2), None if concrete else hit.shape[-2])
    needs_dense = mask.attention_mask is not None and (not concrete or not bool(uniform))
    return BlockTable(*kv, *q, block_q=block_q, block_k=block_k, needs_dense_mask=needs_dense)
