"""`MaskInfo`: an attention mask kept as what it was built from, made dense only on request.

Attention kernels are fastest when a mask arrives as segment ids plus static flags (causal, sliding
window): they can skip whole blocks and never read an `[Sq, Sk]` tensor from memory. `MaskInfo`
records the source (segment ids, a dense mask, or both) and the transforms applied to it, and hands a
kernel that description through `canonical`, falling back to a dense mask only when nothing else can
say it. Asked for what it does not hold (`.attention_mask` of one built from segments,
`.q_segment_ids` of one built from a dense mask), it computes the answer.

Semantics. Query `i` may attend key `j` of batch row `b` when the *hard* constraints hold (segments:
`q_seg[b, i] == kv_seg[b, j] >= 0`; the dense source mask; and `j < kv_lengths[b]`) and the *soft*
constraints hold (causal `j <= i`, window `i - left <= j <= i + right`, chunk `i // c == j // c`),
where soft constraints are lifted between positions that share a nonzero token type. Positions are
aligned at the start: query `i` and key `i` are the same token, also when `Sq != Sk`.

A transform that static flags cannot express (a causal or window offset, a window or chunk size
traced under `jit`, the query / key slices of decoding) is *baked*: the mask as it stands, with the
transform applied, becomes the dense source, and the segment ids are kept (sliced alike) so that they
still answer. Kernels then receive that dense mask.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal, NamedTuple, Self

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

Window = tuple[int, int]
UNLIMITED = 2**30
"""A window side given as None (no limit); large, yet safe in int32 position arithmetic."""


class CanonicalMask(NamedTuple):
    """What an attention kernel consumes. The mask to apply is the AND of every field that is set:
    `q_segment_ids[i] == kv_segment_ids[j] >= 0`, `attention_mask`, `causal` and `sliding_window`."""

    q_segment_ids: jax.Array | None
    kv_segment_ids: jax.Array | None
    attention_mask: jax.Array | None
    causal: bool
    sliding_window: Window | None


def _shape_text(shape: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"


def _int_array(name: str, x: ArrayLike, shape: tuple[int | None, ...], legend: str) -> jax.Array:
    """`x` as int32, after checking that it holds integers and has `shape` (None: any size)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{name} must hold integers, got dtype {x.dtype}")
    if len(x.shape) != len(shape) or any(e not in (None, g) for e, g in zip(shape, x.shape, strict=True)):
        raise ValueError(f"{name} must have shape {legend} = {_shape_text(shape)}, got {x.shape}")
    return x if x.dtype == jnp.int32 else x.astype(jnp.int32)


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _is_traced(value: object) -> bool:
    return isinstance(value, jax.core.Tracer)


def _is_zero(offset: object) -> bool:
    """A static offset of 0 (no shift): the transform can stay a flag."""
    return isinstance(offset, int | np.integer) and not isinstance(offset, bool) and offset == 0


def window_pair(window: int | tuple[int, int], name: str = "window") -> Window:
    """An int `w` means `(w, w)`; a pair is `(left, right)`; both sides must be non-negative ints."""
    pair = (window, window) if isinstance(window, int | np.integer) else window
    if (
        not isinstance(pair, tuple | list)
        or len(pair) != 2
        or any(not isinstance(w, int | np.integer) or isinstance(w, bool) for w in pair)
    ):
        raise TypeError(f"{name} must be an int or a (left, right) pair of ints, got {window!r}")
    if min(pair) < 0:
        raise ValueError(f"{name} must be non-negative, got {window!r}")
    return int(pair[0]), int(pair[1])


def clamp_window(window: Window | None, reach: int) -> Window | None:
    """`(left, right)` with each side at most `reach`: past every position a window masks nothing more,
    and kernels computing positions in int32 must not see sides like 2**40."""
    return None if window is None else (min(window[0], reach), min(window[1], reach))


def intersect_windows(a: Window | None, b: Window | None) -> Window | None:
    """The window allowed by both of two `(left, right)` windows (None: no window)."""
    if a is None or b is None:
        return a if b is None else b
    return (min(a[0], b[0]), min(a[1], b[1]))


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


def padding_segment_ids(name: str, cu: ArrayLike, length: int) -> jax.Array:
    """Segment ids [B, length] of a padded batch: row b is valid (0) for its first cu[b+1]-cu[b] tokens."""
    cu = _int_array(name, cu, (None,), "[batch + 1]")
    check_bounds(name, cu, length, total=False)
    return _prefix_segments(cu, length)


@functools.partial(jax.jit, static_argnums=1)
def _prefix_segments(cu: jax.Array, length: int) -> jax.Array:
    lengths = cu[1:] - cu[:-1]
    return jnp.where(jnp.arange(length) < lengths[:, None], 0, -1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=1)
def _random_mask(key: jax.Array, shape: tuple[int, ...], sparsity: float) -> jax.Array:
    draw = jax.random.uniform(key, (math.prod(shape),)).reshape(shape)  # flat: compiles fast on CPU
    row_max = draw == draw.max(axis=-1, keepdims=True)  # one random key per row, always kept
    return (draw >= sparsity) | row_max


# ------------------------------------------------------------------------------ module helpers


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


def _positions_in_runs(ids: jax.Array) -> jax.Array:
    """[..., S] -> each token's index within its run of equal consecutive ids (a packed document's positions)."""
    index = jnp.arange(ids.shape[-1], dtype=jnp.int32)
    starts = jnp.concatenate([jnp.ones_like(ids[..., :1], bool), ids[..., 1:] != ids[..., :-1]], axis=-1)
    run_start = jax.lax.cummax(jnp.where(starts, index, 0), axis=ids.ndim - 1)
    return index - run_start


# ------------------------------------------------------------------------------------- MaskInfo


@dataclasses.dataclass(frozen=True, eq=False)
class MaskInfo:
    """An attention mask as a pytree: its source arrays are leaves, its static transforms aux data.

    Build one with a `from_*` classmethod. The sources: segment ids (`_q_segment_ids` [B, Sq],
    `_kv_segment_ids` [B, Sk], negative = padding) and/or a dense `_attention_mask` [B, 1|H, Sq, Sk]
    bool; the mask is the AND of the sources and the transforms. `q_positions` / `kv_positions` are
    carried for the caller (RoPE); they do not change the mask. Methods work on any leading batch
    shape, so a `MaskInfo` can be `vmap`ped over its batch axis.
    """

    _q_segment_ids: jax.Array | None = None
    _kv_segment_ids: jax.Array | None = None
    _attention_mask: jax.Array | None = None
    kv_length_limit: jax.Array | None = None
    token_type_ids: jax.Array | None = None
    q_positions: jax.Array | None = None
    kv_positions: jax.Array | None = None
    causal: bool = False
    sliding_window: Window | None = None
    chunk_size: int | None = None
    mask_dtype: str = "bool"

    # ----------------------------------------------------------------------------- constructors

    @classmethod
    def from_segments(
        cls,
        q_segment_ids: ArrayLike,
        kv_segment_ids: ArrayLike | None = None,
        q_positions: ArrayLike | None = None,
        kv_positions: ArrayLike | None = None,
        *,
        is_attn_mask: bool = False,
    ) -> Self:
        """From segment ids [B, Sq] (and [B, Sk], default: the query's): equal ids attend, -1 is padding.

        With `is_attn_mask=True` the arrays are 0/1 padding masks (nonzero = a real token) instead.
        """
        q = _int_array("q_segment_ids", q_segment_ids, (None, None), "[batch, q_len]")
        kv = q if kv_segment_ids is None else None
        if kv is None:
            kv = _int_array("kv_segment_ids", kv_segment_ids, (q.shape[0], None), "[batch, kv_len]")
        if is_attn_mask:
            q, kv = (jnp.where(ids != 0, 0, -1).astype(jnp.int32) for ids in (q, kv))
        return cls(_q_segment_ids=q, _kv_segment_ids=kv, **_positions(q_positions, kv_positions, q.shape, kv.shape))

    @classmethod
    def from_attention_mask(
        cls, mask: ArrayLike, q_positions: ArrayLike | None = None, kv_positions: ArrayLike | None = None
    ) -> Self:
        """From a bool/int mask (nonzero = attend): [B, Sq, Sk], [B, 1|H, Sq, Sk], or [B, S] padding.

        A [B, S] mask marks valid tokens (for queries and keys alike) and becomes segment ids 0 / -1.
        """
        m = jnp.asarray(mask)
        if m.dtype != jnp.bool_ and not jnp.issubdtype(m.dtype, jnp.integer):
            raise TypeError(f"mask must be boolean or integer (nonzero = attend), got dtype {m.dtype}")
        m = m.astype(jnp.bool_)
        if m.ndim == 2:
            return cls.from_segments(m.astype(jnp.int32), None, q_positions, kv_positions, is_attn_mask=True)
        if m.ndim == 3:
            m = m[:, None]
        if m.ndim != 4:
            raise ValueError(
                "mask must have shape [batch, seq], [batch, q_len, kv_len] or "
                f"[batch, 1 or heads, q_len, kv_len], got {m.shape}"
            )
        batch, _, q_len, kv_len = m.shape
        return cls(_attention_mask=m, **_positions(q_positions, kv_positions, (batch, q_len), (batch, kv_len)))

    @classmethod
    def from_cu_seqlens(
        cls,
        cu_seqlens_q: ArrayLike,
        cu_seqlens_k: ArrayLike | None = None,
        q_len: int | None = None,
        kv_len: int | None = None,
        *,
        max_q_len: int | None = None,
        cu_seqlens_kv: ArrayLike | None = None,
        max_kv_len: int | None = None,
    ) -> Self:
        """From cumulative lengths [B+1] of a padded batch: row b holds a sequence of length
        `cu[b+1] - cu[b]` at its start, the rest is padding. `q_len` (the query axis length) is
        required; `cu_seqlens_k` defaults to `cu_seqlens_q` and `kv_len` to `q_len`. Upstream's
        keyword names `max_q_len`, `cu_seqlens_kv`, `max_kv_len` are accepted too."""
        q_len = q_len if max_q_len is None else max_q_len
        kv_len = kv_len if max_kv_len is None else max_kv_len
        cu_seqlens_k = cu_seqlens_k if cu_seqlens_kv is None else cu_seqlens_kv
        if q_len is None:
            raise ValueError("q_len (the length of the query sequence axis) is required, got None")
        q_len = _positive_int("q_len", q_len)
        kv_len = q_len if kv_len is None else _positive_int("kv_len", kv_len)
        q = padding_segment_ids("cu_seqlens_q", cu_seqlens_q, q_len)
        if cu_seqlens_k is None and kv_len == q_len:
            return cls(_q_segment_ids=q, _kv_segment_ids=q)
        if cu_seqlens_k is None:
            kv = padding_segment_ids("cu_seqlens_q", cu_seqlens_q, kv_len)
        else:
            kv = padding_segment_ids("cu_seqlens_k", cu_seqlens_k, kv_len)
        if kv.shape[0] != q.shape[0]:
            raise ValueError(
                f"cu_seqlens_k must have batch + 1 = {q.shape[0] + 1} entries like cu_seqlens_q, got {kv.shape[0] + 1}"
            )
        return cls(_q_segment_ids=q, _kv_segment_ids=kv)

    @classmethod
    def from_random(
        cls,
        batch_size: int,
        q_len: int,
        kv_len: int | None = None,
        sparsity: float = 0.5,
        seed: int = 0,
        q_positions: ArrayLike | None = None,
        kv_positions: ArrayLike | None = None,
        *,
        num_heads: int | None = None,
        key: jax.Array | None = None,
    ) -> Self:
        """A random dense mask [B, 1|H, Sq, Sk] dropping about `sparsity` of the pairs, drawn from
        `seed` (or a PRNG `key`); every query row keeps at least one key. For tests and benchmarks."""
        batch, q_len = _positive_int("batch_size", batch_size), _positive_int("q_len", q_len)
        kv_len = q_len if kv_len is None else _positive_int("kv_len", kv_len)
        heads = 1 if num_heads is None else _positive_int("num_heads", num_heads)
        if not 0.0 <= sparsity <= 1.0:
            raise ValueError(f"sparsity must be in [0, 1], got {sparsity!r}")
        key = jax.random.PRNGKey(seed) if key is None else key
        return cls.from_attention_mask(
            _random_mask(key, (batch, heads, q_len, kv_len), sparsity), q_positions, kv_positions
        )

    # ------------------------------------------------------------------------------- transforms

    def apply_causal(self, offset: int | ArrayLike = 0) -> Self:
        """Keep keys `j <= i + offset` (positions counted from the start of the row). `offset` may be
        an int or per batch row [B]; 0 is a static flag, anything else is baked into a dense mask."""
        if _is_zero(offset):
            return dataclasses.replace(self, causal=True)
        off = _per_row(offset, "offset")
        return self._baked(lambda i, j: j <= i + off)

    def apply_sliding_window(
        self,
        sliding_window: int | tuple[int | None, int | None],
        *,
        offset: int | ArrayLike = 0,
        mode: Literal["default", "decode", "prefill"] | None = None,
        index: int | ArrayLike | None = None,
    ) -> Self:
        """Keep keys `i + offset - left <= j <= i + offset + right`; an int `w` means `(w, w)`, a side of
        None no limit. Windows intersect. Static ints without offset stay a flag; a traced window or an
        offset is baked into a dense mask.

        `mode="decode"` then keeps only query row `index` (int or per row) and the `left + right + 1`
        keys around it; `mode="prefill"` keeps the last `left + right + 1` keys (the last `w` for an
        int). Both change the mask's shape, as a sliding-window KV cache does.
        """
        if mode not in (None, "default", "decode", "prefill"):
            raise ValueError(f"mode must be None, 'default', 'decode' or 'prefill', got {mode!r}")
        is_pair = isinstance(sliding_window, tuple | list)
        if is_pair and len(sliding_window) != 2:
            raise TypeError(f"window must be an int or a (left, right) pair of ints, got {sliding_window!r}")
        pair = tuple(UNLIMITED if s is None else s for s in sliding_window) if is_pair else (sliding_window,) * 2
        traced = any(_is_traced(side) for side in pair) or _is_traced(offset)
        if not traced:
            pair = window_pair(pair if is_pair else sliding_window)
        if mode in (None, "default") and not traced and _is_zero(offset):
            return dataclasses.replace(self, sliding_window=intersect_windows(pair, self.sliding_window))
        off = _per_row(offset, "offset")
        left, right = (jnp.asarray(side, jnp.int32) for side in pair)
        out = self._baked(lambda i, j: (j >= i + off - left) & (j <= i + off + right))
        if mode not in ("decode", "prefill"):
            return out
        if traced:
            raise ValueError(f"mode={mode!r} needs a static window: the number of keys it keeps depends on it")
        _, _, kv_len = self._dims()
        width = min(pair[0] if mode == "prefill" and not is_pair else pair[0] + pair[1] + 1, kv_len)
        if mode == "prefill":
            return out._sliced(None, None, kv_len - width, width)
        if index is None:
            raise ValueError("mode='decode' needs index=, the position of the query being decoded")
        row = jnp.asarray(index, jnp.int32)
        return out._sliced(row, 1, jnp.clip(row - pair[0], 0, kv_len - width), width)

    def apply_chunked(self, chunk_size: int | ArrayLike, offset: int | ArrayLike = 0) -> Self:
        """Chunked causal attention (Llama 4): keep keys with `i // chunk_size == j // chunk_size` and
        `j <= i + offset`. A static size without offset stays flags; otherwise baked."""
        if _is_traced(chunk_size) or not _is_zero(offset):
            size = jnp.asarray(chunk_size, jnp.int32)
            off = _per_row(offset, "offset")
            return self._baked(lambda i, j: (i // size == j // size) & (j <= i + off))
        chunk_size = _positive_int("chunk_size", chunk_size)
        if self.chunk_size not in (None, chunk_size):
            raise ValueError(f"chunk_size {self.chunk_size} is already applied, got {chunk_size}")
        return dataclasses.replace(self, chunk_size=chunk_size, causal=True)

    def apply_kv_lengths(
        self,
        kv_lengths: ArrayLike,
        *,
        q_len: int | None = None,
        end_index: ArrayLike | None = None,
        sliding_window: int | None = None,
    ) -> Self:
        """Treat keys at positions `>= kv_lengths[b]` as padding. Repeated calls keep the minimum.

        For decoding from a cache, `q_len` with `end_index [B]` then keeps the query rows
        `[end_index - q_len, end_index)` of each row, and `sliding_window` the last `sliding_window`
        keys before `kv_lengths[b]`: the mask takes the shapes of the step's queries and keys.
        """
        batch, _, kv_len = self._dims()
        lengths = _int_array("kv_lengths", kv_lengths, batch, "[batch]")
        if not isinstance(lengths, jax.core.Tracer) and (np.asarray(lengths) < 0).any():
            raise ValueError(f"kv_lengths must be non-negative, got {np.asarray(lengths).tolist()}")
        if self.kv_length_limit is not None:
            lengths = jnp.minimum(lengths, self.kv_length_limit)
        out = dataclasses.replace(self, kv_length_limit=lengths)
        if q_len is None and sliding_window is None:
            return out
        row = q_rows = None
        if q_len is not None:
            if end_index is None:
                raise ValueError("apply_kv_lengths with q_len needs end_index=, where each row's queries end")
            q_rows = min(_positive_int("q_len", q_len), self._dims()[1])
            row = jnp.clip(_int_array("end_index", end_index, batch, "[batch]") - q_rows, 0, self._dims()[1] - q_rows)
        width = kv_len if sliding_window is None else min(_positive_int("sliding_window", sliding_window), kv_len)
        start = jnp.clip(lengths - width, 0, kv_len - width)
        return out._baked(lambda i, j: True)._sliced(row, q_rows, start, width)

    def apply_token_type_ids(self, token_type_ids: ArrayLike) -> Self:
        """Let tokens of equal nonzero type [B, S] attend each other both ways (Gemma 3: the tokens
        of an image see the whole image), lifting causal, window and chunk constraints between them;
        segments, padding and a dense source mask still apply. Type 0 (text) follows the other rules.
        Give each image its own id to keep images apart. Needs `Sq == Sk`."""
        batch, q_len, kv_len = self._dims()
        if q_len != kv_len:
            raise ValueError(f"token_type_ids need q_len == kv_len, got {q_len} and {kv_len}")
        if self.token_type_ids is not None:
            raise ValueError("token_type_ids are already applied to this MaskInfo")
        types = _int_array("token_type_ids", token_type_ids, (*batch, q_len), "[batch, seq]")
        return dataclasses.replace(self, token_type_ids=types)

    def _baked(self, allowed) -> Self:
        """The mask as it stands AND `allowed(i, j)` (positions, broadcast against `[..., 1|H, Sq, Sk]`)
        as the dense source; the flags are then part of it. Segment ids stay, kv lengths folded in."""
        _, q_len, kv_len = self._dims()
        i, j = jnp.arange(q_len)[:, None], jnp.arange(kv_len)[None, :]
        dense = self.get_or_compute_attention_mask() & allowed(i, j)
        q, kv = self.get_or_compute_segment_ids() if self.has_segments else (None, None)
        return dataclasses.replace(
            self,
            _q_segment_ids=q,
            _kv_segment_ids=kv,
            _attention_mask=dense,
            kv_length_limit=None,
            token_type_ids=None,
            causal=False,
            sliding_window=None,
            chunk_size=None,
        )

    def _sliced(self, q_start, q_rows: int | None, kv_start, kv_cols: int) -> Self:
        """A baked mask cut to query rows `[q_start, q_start + q_rows)` (None: all) and key columns
        `[kv_start, kv_start + kv_cols)`; starts are ints or per batch row. Ids and positions alike."""

        def cut(x, start, size, axis):
            if x is None or start is None:
                return x
            start = jnp.broadcast_to(jnp.asarray(start, jnp.int32), x.shape[:1])
            return jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, size, axis=axis))(x, start)

        mask = cut(cut(self._attention_mask, q_start, q_rows, -2), kv_start, kv_cols, -1)
        return dataclasses.replace(
            self,
            _attention_mask=mask,
            _q_segment_ids=cut(self._q_segment_ids, q_start, q_rows, -1),
            _kv_segment_ids=cut(self._kv_segment_ids, kv_start, kv_cols, -1),
            q_positions=cut(self.q_positions, q_start, q_rows, -1),
            kv_positions=cut(self.kv_positions, kv_start, kv_cols, -1),
        )

    # ---------------------------------------------------------------------------------- queries

    @property
    def has_segments(self) -> bool:
        """Built from segment ids (also from cu_seqlens or a [B, S] padding mask)."""
        return self._q_segment_ids is not None

    @property
    def has_dense_mask(self) -> bool:
        """Holds a dense [B, 1|H, Sq, Sk] mask (given, or baked by a transform)."""
        return self._attention_mask is not None

    def _dims(self) -> tuple[tuple[int, ...], int, int]:
        """(batch shape, Sq, Sk), read from the source arrays (so `vmap` and `shard_map` see local sizes)."""
        if self.has_segments:
            return self._q_segment_ids.shape[:-1], self._q_segment_ids.shape[-1], self._kv_segment_ids.shape[-1]
        if self.has_dense_mask:
            return self._attention_mask.shape[:-3], *self._attention_mask.shape[-2:]
        raise ValueError("MaskInfo has no source: build it with a from_* constructor")

    @property
    def batch_size(self) -> int:
        return math.prod(self._dims()[0])

    @property
    def q_len(self) -> int:
        return self._dims()[1]

    @property
    def kv_len(self) -> int:
        return self._dims()[2]

    @property
    def shape(self) -> tuple[int, int, int]:
        """(batch_size, q_len, kv_len)."""
        return self.batch_size, self.q_len, self.kv_len

    @property
    def attention_mask(self) -> jax.Array:
        """The dense mask [B, 1|H, Sq, Sk] with every transform applied (in `to_dtype`'s dtype, else bool)."""
        return self.get_or_compute_attention_mask(jnp.dtype(self.mask_dtype))

    @property
    def q_segment_ids(self) -> jax.Array:
        """[B, Sq] int32: the segment ids given, or inferred from a dense mask (`mask_to_segment_ids`)."""
        return self.get_or_compute_segment_ids()[0]

    @property
    def kv_segment_ids(self) -> jax.Array:
        """[B, Sk] int32, kv lengths folded in as padding (-1)."""
        return self.get_or_compute_segment_ids()[1]

    @property
    def q_position_ids(self) -> jax.Array:
        """[B, Sq] int32: each query's position within its segment (counting restarts at every segment)."""
        return _positions_in_runs(self.q_segment_ids)

    def _kv_in_length(self, kv_len: int) -> jax.Array:
        """[..., Sk] True where a key lies before its row's kv length limit."""
        return jnp.arange(kv_len) < self.kv_length_limit[..., None]

    @functools.partial(jax.jit, static_argnames="dtype")
    def get_or_compute_attention_mask(self, dtype: DTypeLike = jnp.bool_) -> jax.Array:
        """The dense mask [..., 1|H, Sq, Sk] with every transform applied, cast to `dtype`.

        The query methods are jitted: called eagerly they run as one compiled program per shape.
        """
        _, q_len, kv_len = self._dims()
        hard = jnp.ones((1, 1, 1), jnp.bool_)
        if self.has_segments:
            q, kv = self._q_segment_ids[..., :, None], self._kv_segment_ids[..., None, :]
            hard = ((q == kv) & (q >= 0))[..., None, :, :]
        if self.has_dense_mask:
            hard = hard & self._attention_mask
        if self.kv_length_limit is not None:
            hard = hard & self._kv_in_length(kv_len)[..., None, None, :]
        i, j = jnp.arange(q_len)[:, None], jnp.arange(kv_len)[None, :]
        soft = jnp.ones((q_len, kv_len), jnp.bool_)
        if self.causal:
            soft &= j <= i
        if self.sliding_window is not None:
            soft &= (j >= i - self.sliding_window[0]) & (j <= i + self.sliding_window[1])
        if self.chunk_size is not None:
            soft &= i // self.chunk_size == j // self.chunk_size
        if self.token_type_ids is not None:
            t = self.token_type_ids
            same_type = (t[..., :, None] == t[..., None, :]) & (t[..., :, None] != 0)
            soft = soft | same_type[..., None, :, :]
        return (hard & soft).astype(dtype)

    @functools.partial(jax.jit, static_argnames="per_head")
    def get_or_compute_segment_ids(self, per_head: bool = False) -> tuple[jax.Array, jax.Array]:
        """(q_segment_ids [..., Sq], kv_segment_ids [..., Sk]) int32, kv lengths folded in as padding.

        Without segment ids they are inferred from the dense mask (`mask_to_segment_ids`: exact for
        block-diagonal masks; `per_head` gives them per head of a multi-head mask).
        """
        _, _, kv_len = self._dims()
        if self.has_segments:
            q, kv = self._q_segment_ids, self._kv_segment_ids
        else:
            q, kv = mask_to_segment_ids(self._attention_mask, per_head=per_head)
        if self.kv_length_limit is not None:
            limit = self._kv_in_length(kv_len)
            kv = jnp.where(limit[..., None, :] if kv.ndim > limit.ndim else limit, kv, -1)
        return q, kv

    def get_or_compute_positions(self) -> tuple[jax.Array, jax.Array]:
        """(q_positions [B, Sq], kv_positions [B, Sk]): as given, else each token's position within
        its segment (`q_position_ids`; a single segment counts 0, 1, 2, ...)."""
        q, kv = self.get_or_compute_segment_ids()
        q_pos = self.q_positions if self.q_positions is not None else _positions_in_runs(q)
        kv_pos = self.kv_positions if self.kv_positions is not None else _positions_in_runs(kv)
        return q_pos, kv_pos

    def get_qkv_masks(self, dtype: DTypeLike = jnp.bool_) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(q_mask [B, Sq], kv_mask [B, Sk], attention_mask [B, 1|H, Sq, Sk]): which queries and keys are
        real tokens (a segment id >= 0), and the whole mask."""
        q, kv = self.get_or_compute_segment_ids()
        return (q >= 0).astype(dtype), (kv >= 0).astype(dtype), self.get_or_compute_attention_mask(dtype)

    @jax.jit
    def q_lengths(self) -> jax.Array:
        """Valid (non-padding) queries per batch row, int32."""
        return jnp.sum(self.get_or_compute_segment_ids()[0] >= 0, axis=-1, dtype=jnp.int32)

    @jax.jit
    def kv_lengths(self) -> jax.Array:
        """Valid (non-padding) keys per batch row, int32."""
        return jnp.sum(self.get_or_compute_segment_ids()[1] >= 0, axis=-1, dtype=jnp.int32)

    def is_self_attention(self) -> bool | jax.Array:
        """Whether queries and keys are the same tokens: equal lengths and, with segment ids, equal ids."""
        _, q_len, kv_len = self._dims()
        if q_len != kv_len:
            return False
        if self.has_segments:
            return jnp.array_equal(self._q_segment_ids, self._kv_segment_ids)
        return True

    def to_dtype(self, dtype: DTypeLike) -> Self:
        """The same mask, whose `.attention_mask` comes in `dtype` (kernels always receive bool)."""
        return dataclasses.replace(self, mask_dtype=jnp.dtype(dtype).name)

    def replace(self, **fields) -> Self:
        """A copy with fields replaced; `attention_mask`, `q_segment_ids` and `kv_segment_ids` (upstream's
        names) replace the sources. A value of None leaves that field as it is."""
        names = {"attention_mask": "_attention_mask", "q_segment_ids": "_q_segment_ids"}
        names["kv_segment_ids"] = "_kv_segment_ids"
        changes = {names.get(k, k): v for k, v in fields.items() if v is not None}
        if "_attention_mask" in changes:
            m = jnp.asarray(changes["_attention_mask"]).astype(jnp.bool_)
            changes["_attention_mask"] = m[:, None] if m.ndim == 3 else m
        return dataclasses.replace(self, **changes)

    def canonical(self, num_heads: int) -> CanonicalMask:
        """The kernel's view: segment ids and static flags, plus a dense mask only when they cannot
        express the mask (dense source, chunking, token types). Token types lift causality and the
        window, so with them both live in the dense mask and the flags are off."""
        num_heads = _positive_int("num_heads", num_heads)
        if self.has_dense_mask and self._attention_mask.shape[-3] not in (1, num_heads):
            heads = self._attention_mask.shape[-3]
            raise ValueError(f"attention_mask has {heads} heads, expected 1 or num_heads={num_heads}")
        q, kv = self.get_or_compute_segment_ids() if self.has_segments else (None, None)
        needs_dense = self.has_dense_mask or self.chunk_size is not None or self.token_type_ids is not None
        flags = self.token_type_ids is None
        return CanonicalMask(
            q_segment_ids=q,
            kv_segment_ids=kv,
            attention_mask=self.get_or_compute_attention_mask() if needs_dense else None,
            causal=self.causal and flags,
            sliding_window=self.sliding_window if flags else None,
        )

    def visualize(
        self,
        block_size: int | tuple[int, int] = 32,
        batch: int = 0,
        head: int = 0,
        fit_in_screen: bool = True,
        max_rows: int = 32,
        max_cols: int = 64,
        charset: Literal["unicode", "ascii"] = "unicode",
        show_segments: bool = True,
        return_str: bool = False,
    ) -> str | None:
        """A text picture of one batch row and head of the mask, one character per block of
        `block_size` queries x keys: full, partly allowed, or empty. Blocks grow to fit
        `max_rows` x `max_cols` when `fit_in_screen`. Prints it, or returns it with `return_str`."""
        mask = np.asarray(self.get_or_compute_attention_mask())
        mask = mask.reshape(-1, *mask.shape[-3:])
        if not 0 <= batch < mask.shape[0]:
            raise IndexError(f"batch={batch} is outside the mask's {mask.shape[0]} rows")
        if not 0 <= head < mask.shape[1] and mask.shape[1] != 1:
            raise IndexError(f"head={head} is outside the mask's {mask.shape[1]} heads")
        plane = mask[batch, min(head, mask.shape[1] - 1)]
        rows, cols = (block_size, block_size) if isinstance(block_size, int) else block_size
        rows, cols = max(int(rows), 1), max(int(cols), 1)
        if fit_in_screen:
            rows = max(rows, -(-plane.shape[0] // max_rows))
            cols = max(cols, -(-plane.shape[1] // max_cols))
        padded = np.zeros((-(-plane.shape[0] // rows) * rows, -(-plane.shape[1] // cols) * cols), np.float64)
        padded[: plane.shape[0], : plane.shape[1]] = plane
        fill = padded.reshape(padded.shape[0] // rows, rows, -1, cols).mean(axis=(1, 3))
        full, part, empty = ("█", "▒", "·") if charset == "unicode" else ("#", "+", ".")
        cell = lambda f: full if f >= 1.0 else empty if f <= 0.0 else part
        legend = f"{rows}x{cols} per cell ({full} all, {part} some, {empty} none)"
        lines = [f"MaskInfo batch={batch} head={head}: {plane.shape[0]} queries x {plane.shape[1]} keys, {legend}"]
        q_ids = np.asarray(self.get_or_compute_segment_ids()[0]).reshape(-1, plane.shape[0])[batch]
        for r, line in enumerate(fill):
            label = ""
            if show_segments:  # the segment ids of the cell's queries
                ids = np.unique(q_ids[r * rows : (r + 1) * rows])
                label = "pad " if (ids < 0).all() else f"{ids[0]:>3} " if len(ids) == 1 else "mix "
            lines.append(label + "".join(cell(f) for f in line))
        text = "\n".join(lines)
        if return_str:
            return text
        print(text)
        return None


def _positions(q_positions, kv_positions, q_shape, kv_shape) -> dict:
    """Checked position arrays for a constructor (None stays None: computed on request)."""
    out = {}
    for name, given, shape in (("q_positions", q_positions, q_shape), ("kv_positions", kv_positions, kv_shape)):
        if given is not None:
            out[name] = _int_array(name, given, tuple(shape), "[batch, length]")
    return out


def _per_row(value: int | ArrayLike, name: str) -> jax.Array:
    """An int, or one int per batch row [B], as int32 broadcastable against `[B, 1|H, Sq, Sk]`."""
    value = jnp.asarray(value)
    if not jnp.issubdtype(value.dtype, jnp.integer):
        raise TypeError(f"{name} must be an int or an int array [batch], got dtype {value.dtype}")
    if value.ndim > 1:
        raise ValueError(f"{name} must be an int or [batch], got shape {value.shape}")
    return value.astype(jnp.int32).reshape((*value.shape, 1, 1, 1))


jax.tree_util.register_dataclass(
    MaskInfo,
    data_fields=[
        "_q_segment_ids",
        "_kv_segment_ids",
        "_attention_mask",
        "kv_length_limit",
        "token_type_ids",
        "q_positions",
        "kv_positions",
    ],
    meta_fields=["causal", "sliding_window", "chunk_size", "mask_dtype"],
)
