"""Array-level mask helpers behind `MaskInfo`: segment ids and dense masks from each other, padding
from cumulative lengths, and the checks that turn bad input into clear errors."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike


def _shape_text(shape: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"


def int_array(name: str, x: ArrayLike, shape: tuple[int | None, ...], legend: str) -> jax.Array:
    """`x` as int32, after checking that it holds integers and has `shape` (None: any size)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{name} must hold integers, got dtype {x.dtype}")
    if len(x.shape) != len(shape) or any(e not in (None, g) for e, g in zip(shape, x.shape, strict=True)):
        raise ValueError(f"{name} must have shape {legend} = {_shape_text(shape)}, got {x.shape}")
    return x if x.dtype == jnp.int32 else x.astype(jnp.int32)


def positive_int(name: str, value: object) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def is_traced(value: object) -> bool:
    return isinstance(value, jax.core.Tracer)


def is_zero(offset: object) -> bool:
    """A static offset of 0 (no shift): the transform can stay a flag."""
    return isinstance(offset, int | np.integer) and not isinstance(offset, bool) and offset == 0


def check_bounds(name: str, cu: jax.Array, limit: int, *, total: bool, exact: bool = False) -> None:
    """Cumulative lengths `[0, n1, n1+n2, ...]`: integers `[N + 1]` (N >= 1), and where concrete (outside
    `jit`) from 0, never decreasing, and each length (`total`: the last bound; `exact`: equal to it) at most
    `limit`."""
    if not jnp.issubdtype(cu.dtype, jnp.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {cu.dtype}")
    if cu.ndim != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name} must be [num_seqs + 1] with at least 2 bounds, got shape {cu.shape}")
    if isinstance(cu, jax.core.Tracer):
        return
    bounds = np.asarray(cu)
    wanted = f"{'== ' if exact else '<= '}{limit}"
    if bounds[0] != 0 or (np.diff(bounds) < 0).any():
        raise ValueError(f"{name} must rise from 0 without decreasing, got {bounds.tolist()}")
    ends = bounds[-1:] if total else np.diff(bounds)
    if (ends != limit).any() if exact else (ends > limit).any():
        what = f"its last bound, {bounds[-1]}," if total else f"each of its lengths {ends.tolist()}"
        raise ValueError(f"{name}: {what} must be {wanted} (the length of the axis), got {bounds.tolist()}")


def padding_ids(valid: jax.Array) -> jax.Array:
    """Segment ids of a validity mask `[..., S]`: 0 for a real token, -1 for padding."""
    return jnp.where(valid, 0, -1).astype(jnp.int32)


def padding_segment_ids(name: str, cu: ArrayLike, length: int) -> jax.Array:
    """Segment ids [B, length] of a padded batch: row b is valid (0) for its first cu[b+1]-cu[b] tokens."""
    cu = int_array(name, cu, (None,), "[batch + 1]")
    check_bounds(name, cu, length, total=False)
    return _prefix_segments(cu, length)


@functools.partial(jax.jit, static_argnums=1)
def _prefix_segments(cu: jax.Array, length: int) -> jax.Array:
    lengths = cu[1:] - cu[:-1]
    return padding_ids(jnp.arange(length) < lengths[:, None])


@functools.partial(jax.jit, static_argnums=1)
def random_mask(key: jax.Array, shape: tuple[int, ...], sparsity: float) -> jax.Array:
    draw = jax.random.uniform(key, (math.prod(shape),)).reshape(shape)  # flat: compiles fast on CPU
    row_max = draw == draw.max(axis=-1, keepdims=True)  # one random key per row, always kept
    return (draw >= sparsity) | row_max


def _group_ids(rows: jax.Array) -> jax.Array:
    """[..., N, M] bool -> [..., N] int32: rows with equal patterns share an id, numbered in order of
    first appearance from 0; all-False rows get -1."""
    same = jnp.all(rows[..., :, None, :] == rows[..., None, :, :], axis=-1)  # [..., N, N]
    first = jnp.argmax(same, axis=-1)  # the first row with this row's pattern
    valid = jnp.any(rows, axis=-1)
    n = rows.shape[-2]
    founds = (first == jnp.arange(n)) & valid  # rows that start a new group
    before = jnp.cumsum(founds, axis=-1) - founds  # groups started before each row
    ids = jnp.take_along_axis(before, first, axis=-1)
    return jnp.where(valid, ids, -1).astype(jnp.int32)


def mask_to_segment_ids(mask: ArrayLike, per_head: bool = False) -> tuple[jax.Array, jax.Array]:
    """(q_segment_ids, kv_segment_ids) of a bool mask `[Sq, Sk]`, `[B, Sq, Sk]` or `[B, H, Sq, Sk]`.

    Queries with equal rows share an id, as do keys with equal columns; a query or key that attends
    nothing gets -1. For a block-diagonal mask (packed documents) the ids reproduce the mask exactly;
    for others they group equal patterns only. A 4-D mask gives `[B, S]` ids from the union of its
    heads, or `[B, H, S]` with `per_head=True`.
    """
    m = jnp.asarray(mask).astype(jnp.bool_)
    if m.ndim not in (2, 3, 4):
        raise ValueError(f"mask must be [Sq, Sk], [B, Sq, Sk] or [B, H, Sq, Sk], got shape {m.shape}")
    if m.ndim == 4 and not per_head:
        m = jnp.any(m, axis=1)
    return _group_ids(m), _group_ids(jnp.swapaxes(m, -1, -2))


def segment_ids_to_qkv_masks(
    q_segment_ids: ArrayLike, kv_segment_ids: ArrayLike | None = None, dtype: DTypeLike = jnp.bool_
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(q_mask [B, Sq], kv_mask [B, Sk], attention_mask [B, 1, Sq, Sk]) in `dtype` from segment ids
    (-1: padding; equal ids attend). `kv_segment_ids` defaults to the query's."""
    q = jnp.asarray(q_segment_ids)
    kv = q if kv_segment_ids is None else jnp.asarray(kv_segment_ids)
    q_valid, kv_valid = q >= 0, kv >= 0
    pairs = (q[..., :, None] == kv[..., None, :]) & q_valid[..., :, None] & kv_valid[..., None, :]
    return q_valid.astype(dtype), kv_valid.astype(dtype), pairs[..., None, :, :].astype(dtype)


def segment_ids_to_mask(
    segment_ids: ArrayLike | tuple[ArrayLike, ArrayLike],
    dtype: DTypeLike = jnp.bool_,
    return_separate_masks: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array, jax.Array]:
    """The `[B, 1, Sq, Sk]` mask of segment ids `[B, S]` (self-attention) or of a `(q, kv)` pair; with
    `return_separate_masks`, `(q_mask, kv_mask, attention_mask)` as `segment_ids_to_qkv_masks`."""
    q, kv = segment_ids if isinstance(segment_ids, tuple) else (segment_ids, None)
    masks = segment_ids_to_qkv_masks(q, kv, dtype)
    return masks if return_separate_masks else masks[2]


def positions_in_runs(ids: jax.Array) -> jax.Array:
    """[..., S] -> each token's index within its run of equal consecutive ids (a packed document's positions)."""
    index = jnp.arange(ids.shape[-1], dtype=jnp.int32)
    starts = jnp.concatenate([jnp.ones_like(ids[..., :1], bool), ids[..., 1:] != ids[..., :-1]], axis=-1)
    run_start = jax.lax.cummax(jnp.where(starts, index, 0), axis=ids.ndim - 1)
    return index - run_start


def checked_positions(q_positions, kv_positions, q_shape, kv_shape) -> dict:
    """Checked position arrays for a constructor (None stays None: computed on request)."""
    out = {}
    for name, given, shape in (("q_positions", q_positions, q_shape), ("kv_positions", kv_positions, kv_shape)):
        if given is not None:
            out[name] = int_array(name, given, tuple(shape), "[batch, length]")
    return out


def per_row(value: int | ArrayLike, name: str) -> jax.Array:
    """An int, or one int per batch row [B], as int32 broadcastable against `[B, 1|H, Sq, Sk]`."""
    value = jnp.asarray(value)
    if not jnp.issubdtype(value.dtype, jnp.integer):
        raise TypeError(f"{name} must be an int or an int array [batch], got dtype {value.dtype}")
    if value.ndim > 1:
        raise ValueError(f"{name} must be an int or [batch], got shape {value.shape}")
    return value.astype(jnp.int32).reshape((*value.shape, 1, 1, 1))


def nonzero_mask(name: str, mask: ArrayLike) -> jax.Array:
    """A bool, integer or float mask as bool: nonzero means attend (or valid)."""
    mask = jnp.asarray(mask)
    if not (
        mask.dtype == jnp.bool_ or jnp.issubdtype(mask.dtype, jnp.integer) or jnp.issubdtype(mask.dtype, jnp.floating)
    ):
        raise TypeError(f"{name} must be boolean, integer or float (nonzero = attend), got dtype {mask.dtype}")
    return mask if mask.dtype == jnp.bool_ else mask != 0
