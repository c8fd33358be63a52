"""Block-sparse masks: every way of giving one reduced to a canonical `SparseMask`, and the predicate of its
positional rules (causal, sliding window, chunked) that kernels evaluate on a tile."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.types import MaskInfo
from ejkernel.types.windows import intersect_windows, window_pair


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
