"""What the sparse attention implementations share, on every platform.

Block-sparse attention: a mask in canonical form (`SparseMask`: segment ids, a dense mask, and the
positional rules causal / sliding window / chunked), the predicate of the positional rules for a tile,
and the block table built from them once per call: per query block, the key blocks holding at least
one allowed pair (and whether the tile needs its token mask), and the transposed lists per key block.
Kernels iterate the lists; an empty block is never visited.

Native sparse attention: the packing of sequences (`cu_seqlens`), the compressed keys and values
(block means), the compressed branch, the choice of blocks from its scores, and the clean-up of
selected block lists that every implementation iterates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.kernels._common.attention import fold_sinks, pad_axes
from ejkernel.types import MaskInfo
from ejkernel.types.mask_info import intersect_windows, window_pair

# ---- block-sparse masks ----


class SparseMask(NamedTuple):
    """A block-sparse attention mask: query `i` may attend key `j` where every set field allows it.

    `q_segment_ids [B, Sq]` / `kv_segment_ids [B, Sk]`: equal non-negative ids; `attention_mask`
    `[1|B, 1|H, Sq, Sk]` bool; `causal`: `j <= i`; `sliding_window (left, right)`:
    `i - left <= j <= i + right`; `chunk_size c`: `i // c == j // c`.
    """

    q_segment_ids: jax.Array | None
    kv_segment_ids: jax.Array | None
    attention_mask: jax.Array | None
    causal: bool
    sliding_window: tuple[int, int] | None
    chunk_size: int | None


def position_allowed(q_pos, k_pos, *, causal: bool, window: tuple[int, int] | None, chunk_size: int | None):
    """Boolean tile of the positional rules for int32 positions that broadcast together (None: all allowed)."""
    ok = None

    def both(a, b):
        return b if a is None else a & b

    if causal:
        ok = both(ok, k_pos <= q_pos)
    if window is not None:
        ok = both(ok, (k_pos >= q_pos - window[0]) & (k_pos <= q_pos + window[1]))
    if chunk_size is not None:
        ok = both(ok, q_pos // chunk_size == k_pos // chunk_size)  # positions >= 0: floor is the chunk
    return ok


def _is_concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs if x is not None)


def _and_dense(a, b):
    """Conjunction of two `[1|B, 1|H, Sq, Sk]` masks (None: everything allowed)."""
    if a is None or b is None:
        return a if b is None else b
    return a & b


def _segments_as_dense(q_seg, kv_seg):
    return ((q_seg[:, :, None] == kv_seg[:, None, :]) & (q_seg[:, :, None] >= 0))[:, None]


def _check_segments(q_seg, kv_seg, batch: int, q_len: int, kv_len: int):
    if (q_seg is None) != (kv_seg is None):
        raise ValueError("q_segment_ids and kv_segment_ids must be given together")
    if q_seg is None:
        return None, None
    for name, x, length in (("q_segment_ids", q_seg, q_len), ("kv_segment_ids", kv_seg, kv_len)):
        if not jnp.issubdtype(x.dtype, jnp.integer):
            raise TypeError(f"{name} must hold integers, got dtype {x.dtype}")
        if x.shape != (batch, length):
            raise ValueError(f"{name} must be [batch, seq] = ({batch}, {length}), got {x.shape}")
    return q_seg.astype(jnp.int32), kv_seg.astype(jnp.int32)


def _builder_mask(mask_builder: Callable, batch: int, heads: int, q_len: int, kv_len: int):
    """`mask_builder(q_idx [Sq, 1], kv_idx [1, Sk])` as a `[1|B, 1|H, Sq, Sk]` bool mask."""
    with jax.ensure_compile_time_eval():  # a builder of positions alone gives a concrete mask
        q_idx = jnp.arange(q_len, dtype=jnp.int32)[:, None]
        kv_idx = jnp.arange(kv_len, dtype=jnp.int32)[None, :]
        built = jnp.asarray(mask_builder(q_idx, kv_idx))
    if built.dtype != jnp.bool_ and not jnp.issubdtype(built.dtype, jnp.integer):
        raise TypeError(f"mask_builder must return a boolean (or integer) mask, got dtype {built.dtype}")
    shape = (1,) * (4 - built.ndim) + built.shape if built.ndim <= 4 else built.shape
    if len(shape) != 4 or shape[0] not in (1, batch) or shape[1] not in (1, heads) or shape[2] not in (1, q_len):
        raise ValueError(
            f"mask_builder must return a mask broadcastable to [Sq, Sk] or [1|{batch}, 1|{heads}, Sq, Sk] "
            f"= [{q_len}, {kv_len}], got shape {built.shape}"
        )
    if shape[3] not in (1, kv_len):
        raise ValueError(f"mask_builder's mask must end in [Sq, Sk] = [{q_len}, {kv_len}], got {built.shape}")
    return jnp.broadcast_to(built.reshape(shape).astype(bool), (*shape[:2], q_len, kv_len))


@jax.ensure_compile_time_eval()  # (a context manager that also decorates)
def canonical_sparse_mask(
    batch: int,
    heads: int,
    q_len: int,
    kv_len: int,
    *,
    mask_info: MaskInfo | None = None,
    attention_mask=None,
    mask_builder: Callable | None = None,
    causal: bool = True,
    sliding_window: int | tuple[int, int] | None = None,
    chunk_size: int | None = None,
    q_segment_ids=None,
    kv_segment_ids=None,
) -> SparseMask:
    """Every way of giving a block-sparse mask, reduced to one `SparseMask` (the AND of all of them).

    Idempotent: a `SparseMask`'s own fields passed back in give the same mask. Positional rules stay
    rules (they cost nothing to evaluate in a kernel); a second segmentation, token types and the
    mask of `mask_builder` become a dense mask.

    Masks known while tracing stay concrete (the reduction runs eagerly on them, inside `jit` too), so
    that the block table built from them is a constant.
    """
    window = None if sliding_window is None else window_pair(sliding_window, "sliding_window")
    if chunk_size is not None and (not isinstance(chunk_size, int | np.integer) or chunk_size <= 0):
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    q_seg, kv_seg = _check_segments(q_segment_ids, kv_segment_ids, batch, q_len, kv_len)
    infos = [] if mask_info is None else [mask_info]
    if attention_mask is not None:
        attention_mask = jnp.asarray(attention_mask)
        if attention_mask.ndim not in (2, 3, 4):
            raise ValueError(
                "attention_mask must be [batch, seq], [batch, q_len, kv_len] or [batch, 1|heads, q_len, kv_len], "
                f"got shape {attention_mask.shape}"
            )
        if attention_mask.ndim == 2 and q_len != kv_len:
            raise ValueError(
                f"attention_mask [batch, seq] marks padding of queries and keys alike and needs q_len == kv_len, "
                f"got shape {attention_mask.shape} for q_len={q_len}, kv_len={kv_len}"
            )
        infos.append(MaskInfo.from_attention_mask(attention_mask))
    dense = None
    for info in infos:
        if info.chunk_size is not None and info.token_type_ids is None and chunk_size in (None, info.chunk_size):
            chunk_size, info = info.chunk_size, dataclasses.replace(info, chunk_size=None)
        canonical = info.canonical(heads)
        for x, tail in (
            (canonical.q_segment_ids, (q_len,)),
            (canonical.kv_segment_ids, (kv_len,)),
            (canonical.attention_mask, (q_len, kv_len)),
        ):
            if x is not None and (x.shape[-len(tail) :] != tail or x.shape[0] not in (1, batch)):
                raise ValueError(
                    f"mask_info / attention_mask must describe batch={batch}, q_len={q_len}, kv_len={kv_len}; "
                    f"it gives a mask of shape {x.shape}"
                )
        causal = causal or canonical.causal
        window = intersect_windows(window, canonical.sliding_window)
        dense = _and_dense(dense, canonical.attention_mask)
        if canonical.q_segment_ids is not None:
            if q_seg is None:
                q_seg = jnp.broadcast_to(canonical.q_segment_ids, (batch, q_len))
                kv_seg = jnp.broadcast_to(canonical.kv_segment_ids, (batch, kv_len))
            else:
                dense = _and_dense(dense, _segments_as_dense(canonical.q_segment_ids, canonical.kv_segment_ids))
    if mask_builder is not None:
        dense = _and_dense(dense, _builder_mask(mask_builder, batch, heads, q_len, kv_len))
    if dense is not None:
        if dense.ndim != 4 or dense.shape[0] not in (1, batch) or dense.shape[1] not in (1, heads):
            raise ValueError(f"attention_mask must be [1|{batch}, 1|{heads}, Sq, Sk], got {dense.shape}")
        dense = dense.astype(bool)
    return SparseMask(q_seg, kv_seg, dense, bool(causal), window, None if chunk_size is None else int(chunk_size))


# ---- the block table ----


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
        concrete = _is_concrete(mask.q_segment_ids, mask.kv_segment_ids, mask.attention_mask)
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


# ---- one block-sparse call, checked ----


class BlockSparseCall(NamedTuple):
    """A checked block-sparse attention call: sizes, operands in canonical form, and the mask."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    bias: jax.Array | None  # [1|B, 1|H, Sq, Sk]
    sink: jax.Array | None  # [H] float32: each head's sinks folded into one logit
    mask: SparseMask
    softmax_scale: float
    soft_cap: float | None


def blocksparse_call(
    who: str,
    query,
    key,
    value,
    softmax_aux=None,
    bias=None,
    *,
    fuses_backward: bool,
    dtypes=None,
    max_head_dim: int | None = None,
    mask_info=None,
    attention_mask=None,
    sequence_parallelism_mesh_axis_name=None,
    logits_soft_cap=None,
    qkv_layouts=None,
    softmax_scale=None,
    mask_builder=None,
    sliding_window=None,
    chunk_size=None,
    causal=True,
    fused_backward=False,
    purify=False,
    q_segment_ids=None,
    kv_segment_ids=None,
) -> BlockSparseCall:
    """Checks a call of implementation `who` (`[B, H, S, D]` layout) and puts it in canonical form.

    The keyword options are the public ones of `blocksparse_attention` (with their defaults), plus
    canonical segment ids. Shape errors are ValueError. NotImplementedError (so that automatic
    dispatch moves on): options no implementation serves, `fused_backward=True` where the backward
    is not one fused pass (`fuses_backward`), and for a kernel implementation, dtypes outside
    `dtypes`, head dims over `max_head_dim` and empty inputs. `purify` needs nothing: a query row
    with no allowed key (a padded one) is always zero.
    """
    del purify
    for name, x in (("query", query), ("key", key), ("value", value)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name} must be [batch, heads, seq, dim], got shape {getattr(x, 'shape', None)}")
    batch, heads, q_len, head_dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    if key.shape[0] != batch or value.shape[:3] != key.shape[:3] or key.shape[3] != head_dim:
        raise ValueError(
            f"key and value must be [batch={batch}, kv_heads, kv_len, dim={head_dim}] and [.., dim_v] alike, "
            f"got key {key.shape}, value {value.shape}"
        )
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({kv_heads})")
    if dtypes is not None:
        names = "/".join(jnp.dtype(d).name for d in dtypes)
        for name, x in (("query", query), ("key", key), ("value", value), ("bias", bias)):
            if x is not None and jnp.dtype(x.dtype) not in dtypes:
                raise NotImplementedError(f"{who} takes {names}, got {name} {x.dtype}")
        if not query.dtype == key.dtype == value.dtype:
            raise NotImplementedError(f"{who} needs one dtype for query/key/value, got {query.dtype}/{key.dtype}")
        if max(head_dim, value.shape[-1]) > max_head_dim:
            raise NotImplementedError(f"{who} supports head dims up to {max_head_dim}, got {head_dim}")
        if min(batch, heads, q_len, kv_len) == 0:
            raise NotImplementedError(f"{who} needs non-empty inputs")
    refused = [
        ("qkv_layouts", qkv_layouts is not None),
        (
            "sequence_parallelism_mesh_axis_name (shard the sequence with ring_attention)",
            sequence_parallelism_mesh_axis_name is not None,
        ),
        ("fused_backward=True", fused_backward and not fuses_backward),
    ]
    names = [name for name, used in refused if used]
    if names:
        raise NotImplementedError(f"{who} does not support {', '.join(names)}")
    if bias is not None:
        bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape) if bias.ndim < 4 else bias
        if (
            bias.ndim != 4
            or bias.shape[0] not in (1, batch)
            or bias.shape[1] not in (1, heads)
            or bias.shape[2:] != (q_len, kv_len)
        ):
            raise ValueError(f"bias must be [1|{batch}, 1|{heads}, {q_len}, {kv_len}], got {tuple(bias.shape)}")
    sink = None
    if softmax_aux is not None:
        if softmax_aux.ndim != 1 or softmax_aux.shape[0] == 0:
            raise ValueError(f"softmax_aux must be a non-empty 1-D array, got shape {softmax_aux.shape}")
        sink = fold_sinks(softmax_aux, heads)
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be positive, got {logits_soft_cap}")
    mask = canonical_sparse_mask(
        batch,
        heads,
        q_len,
        kv_len,
        mask_info=mask_info,
        attention_mask=attention_mask,
        mask_builder=mask_builder,
        causal=causal,
        sliding_window=sliding_window,
        chunk_size=chunk_size,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
    )
    return BlockSparseCall(
        batch,
        heads,
        kv_heads,
        q_len,
        kv_len,
        bias,
        sink,
        mask,
        float(head_dim**-0.5 if softmax_scale is None else softmax_scale),
        None if logits_soft_cap is None else float(logits_soft_cap),
    )


def padded_mask_operands(call: BlockSparseCall, table: BlockTable, q_pad: int, kv_pad: int):
    """What the kernels read of the mask, padded by `q_pad` / `kv_pad` positions: (bias, dense mask as int8
    or None when the table says it all, q segment ids, kv segment ids; padding ids -1)."""
    mask = call.mask
    dense = None
    if table.needs_dense_mask:
        dense = pad_axes(mask.attention_mask.astype(jnp.int8), {2: q_pad, 3: kv_pad})
    q_seg = kv_seg = None
    if mask.q_segment_ids is not None:
        q_seg = pad_axes(mask.q_segment_ids, {1: q_pad}, value=-1)
        kv_seg = pad_axes(mask.kv_segment_ids, {1: kv_pad}, value=-1)
    return pad_axes(call.bias, {2: q_pad, 3: kv_pad}), dense, q_seg, kv_seg


# ---- native sparse attention: packing, compressed branch, block selection ----


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
    xp = np if _is_concrete(cu_seqlens) else jnp
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
    if _is_concrete(idx, pack.length):
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
        if _is_concrete(counts) and (np.asarray(counts) < 0).any():
            raise ValueError(f"block_counts must be non-negative, got {int(np.asarray(counts).min())}")
    if cu_seqlens is not None:
        if not jnp.issubdtype(cu_seqlens.dtype, jnp.integer) or cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2:
            raise ValueError(f"cu_seqlens must be 1-D integer bounds [0, n1, n1+n2, ...], got {cu_seqlens.shape}")
        if batch != 1:
            raise ValueError(f"with cu_seqlens the sequences are packed into one row: batch must be 1, got {batch}")
        if _is_concrete(cu_seqlens):
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
