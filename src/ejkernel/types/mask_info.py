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

Segment ids held beside a dense mask that they were not folded into (those `from_attention_mask` and
`materialize_segment_ids` derive from the mask, or those kept beside a mask given to `replace`) only
describe it: `.q_segment_ids` returns them, but the dense mask alone is the hard constraint.

The `*_baked_in` flags and the axis names are carried for the caller (EasyDeL reads them to decide
what it still has to pass a kernel, and how to shard); they never change the mask.
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

from ejkernel.types.mask_arrays import (
    UNLIMITED,
    Window,
    check_bounds,
    checked_positions,
    clamp_window,
    int_array,
    intersect_windows,
    is_traced,
    is_zero,
    mask_to_segment_ids,
    nonzero_mask,
    padding_ids,
    padding_segment_ids,
    per_row,
    positions_in_runs,
    positive_int,
    random_mask,
    segment_ids_to_mask,
    segment_ids_to_qkv_masks,
    window_pair,
)

__all__ = [  # with the helpers that lived here before `mask_arrays`: kernels import them from this module
    "UNLIMITED",
    "CanonicalMask",
    "MaskInfo",
    "Window",
    "check_bounds",
    "clamp_window",
    "intersect_windows",
    "mask_to_segment_ids",
    "padding_segment_ids",
    "segment_ids_to_mask",
    "segment_ids_to_qkv_masks",
    "window_pair",
]

BATCH_AXES = ("dp", "fsdp")
"""Default `batch_axis_name`: the mesh axes a batch is sharded over."""
AXIS_FIELDS = ("batch_axis_name", "qheads_axis_name", "kvheads_axis_name", "sequence_axis_name")
BAKED_IN_FIELDS = {
    "causal": "causal_mask_baked_in",
    "sliding_window": "sliding_window_baked_in",
    "chunked": "chunked_mask_baked_in",
    "token_type_ids": "token_type_ids_baked_in",
}
"""`baked_in_masks` keys and the flags that answer them."""
REPLACE_ALIASES = {
    "attention_mask": "_attention_mask",
    "q_segment_ids": "_q_segment_ids",
    "kv_segment_ids": "_kv_segment_ids",
    "cu_seqlens_q": "_cu_seqlens_q",
    "cu_seqlens_kv": "_cu_seqlens_kv",
}
"""Upstream's names that `replace` takes for the source fields (None: keep the field)."""
SOURCE_FIELDS = {"_attention_mask", "_q_segment_ids", "_kv_segment_ids"}


class CanonicalMask(NamedTuple):
    """What an attention kernel consumes. The mask to apply is the AND of every field that is set:
    `q_segment_ids[i] == kv_segment_ids[j] >= 0`, `attention_mask`, `causal` and `sliding_window`."""

    q_segment_ids: jax.Array | None
    kv_segment_ids: jax.Array | None
    attention_mask: jax.Array | None
    causal: bool
    sliding_window: Window | None


@dataclasses.dataclass(frozen=True, eq=False)
class MaskInfo:
    """An attention mask as a pytree: its arrays are leaves; flags, sizes and axis names aux data.

    Build one with a `from_*` classmethod (or `dynamic_init`). The sources: segment ids
    (`_q_segment_ids` [B, Sq], `_kv_segment_ids` [B, Sk], negative = padding) and/or a dense
    `_attention_mask` [B, 1|H, Sq, Sk] (bool or int, nonzero = attend); the mask is the AND of the
    sources and the transforms, except that ids which only describe a dense mask (see the module
    docstring) take no part. `q_positions` / `kv_positions` and `_cu_seqlens_q` / `_cu_seqlens_kv`
    are carried for the caller (RoPE, varlen kernels); they do not change the mask. Methods work on any
    leading batch shape, so a `MaskInfo` can be `vmap`ped over its batch axis.
    """

    _q_segment_ids: jax.Array | None = None
    _kv_segment_ids: jax.Array | None = None
    _attention_mask: jax.Array | None = None
    kv_length_limit: jax.Array | None = None
    token_type_ids: jax.Array | None = None
    q_positions: jax.Array | None = None
    kv_positions: jax.Array | None = None
    _cu_seqlens_q: jax.Array | None = None
    _cu_seqlens_kv: jax.Array | None = None
    causal: bool = False
    sliding_window: Window | None = None
    chunk_size: int | None = None
    mask_dtype: str = "bool"
    _ids_describe_only: bool = False
    causal_mask_baked_in: bool = False
    sliding_window_baked_in: bool = False
    chunked_mask_baked_in: bool = False
    token_type_ids_baked_in: bool = False
    batch_axis_name: str | tuple[str, ...] | None = BATCH_AXES
    qheads_axis_name: str | tuple[str, ...] | None = "tp"
    kvheads_axis_name: str | tuple[str, ...] | None = "tp"
    sequence_axis_name: str | tuple[str, ...] | None = "sp"

    def __post_init__(self):
        # Axis names are aux data, which must hash: a list of axes becomes a tuple.
        for name in AXIS_FIELDS:
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))

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
        q = int_array("q_segment_ids", q_segment_ids, (None, None), "[batch, q_len]")
        kv = q if kv_segment_ids is None else None
        if kv is None:
            kv = int_array("kv_segment_ids", kv_segment_ids, (q.shape[0], None), "[batch, kv_len]")
        if is_attn_mask:
            q, kv = padding_ids(q != 0), padding_ids(kv != 0)
        return cls(
            _q_segment_ids=q, _kv_segment_ids=kv, **checked_positions(q_positions, kv_positions, q.shape, kv.shape)
        )

    @classmethod
    def from_attention_mask(
        cls,
        attention_mask: ArrayLike,
        q_positions: ArrayLike | None = None,
        kv_positions: ArrayLike | None = None,
        *,
        mask_is_valid: bool = True,
        batch_axis_name: str | tuple[str, ...] | None = BATCH_AXES,
        qheads_axis_name: str | tuple[str, ...] | None = "tp",
        kvheads_axis_name: str | tuple[str, ...] | None = "tp",
        sequence_axis_name: str | tuple[str, ...] | None = "sp",
    ) -> Self:
        """From a bool, int or float mask, nonzero = attend (`mask_is_valid=False`: nonzero = blocked, as
        in PyTorch): [B, S] padding, [B, Sq, Sk] or [B, 1|H, Sq, Sk].

        A [B, S] mask marks real tokens (queries and keys alike) and becomes segment ids 0 / -1. A dense
        mask is kept as given, with padding ids that describe it: a query is real if it attends to any
        key in any head, a key if any query attends to it.
        """
        m = nonzero_mask("attention_mask", attention_mask)
        m = m if mask_is_valid else ~m
        axes = dict(
            batch_axis_name=batch_axis_name,
            qheads_axis_name=qheads_axis_name,
            kvheads_axis_name=kvheads_axis_name,
            sequence_axis_name=sequence_axis_name,
        )
        if m.ndim == 2:
            padding = cls.from_segments(m.astype(jnp.int32), None, q_positions, kv_positions, is_attn_mask=True)
            return dataclasses.replace(padding, **axes)
        if m.ndim == 3:
            m = m[:, None]
        if m.ndim != 4:
            raise ValueError(
                "attention_mask must have shape [batch, seq], [batch, q_len, kv_len] or "
                f"[batch, 1 or heads, q_len, kv_len], got {m.shape}"
            )
        batch, _, q_len, kv_len = m.shape
        return cls(
            _attention_mask=m,
            _q_segment_ids=padding_ids(jnp.any(m, axis=(1, 3))),
            _kv_segment_ids=padding_ids(jnp.any(m, axis=(1, 2))),
            _ids_describe_only=True,
            **checked_positions(q_positions, kv_positions, (batch, q_len), (batch, kv_len)),
            **axes,
        )

    @classmethod
    def dynamic_init(
        cls,
        *,
        mask_info: MaskInfo | None = None,
        input_ids: ArrayLike | None = None,
        inputs_embeds: ArrayLike | None = None,
        attention_mask: ArrayLike | None = None,
    ) -> MaskInfo:
        """The mask of a model call: `mask_info` itself when given; else `from_attention_mask(attention_mask)`
        (nonzero = a real token or an allowed pair); else every token real, in the shape of `input_ids`
        [B, S] or of `inputs_embeds` [B, S, D]. Nothing causal is applied: the model does that."""
        if mask_info is not None:
            return mask_info
        if attention_mask is None:
            name, shaped, rank = (
                ("input_ids", input_ids, 2) if input_ids is not None else ("inputs_embeds", inputs_embeds, 3)
            )
            if shaped is None:
                raise ValueError(
                    "dynamic_init needs mask_info, attention_mask, input_ids or inputs_embeds; all are None"
                )
            if jnp.ndim(shaped) != rank:
                raise ValueError(f"{name} must have {rank} dimensions, got shape {jnp.shape(shaped)}")
            attention_mask = jnp.ones(jnp.shape(shaped)[:2], jnp.bool_)
        return cls.from_attention_mask(attention_mask)

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
        q_len = positive_int("q_len", q_len)
        kv_len = q_len if kv_len is None else positive_int("kv_len", kv_len)
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
        batch, q_len = positive_int("batch_size", batch_size), positive_int("q_len", q_len)
        kv_len = q_len if kv_len is None else positive_int("kv_len", kv_len)
        heads = 1 if num_heads is None else positive_int("num_heads", num_heads)
        if not 0.0 <= sparsity <= 1.0:
            raise ValueError(f"sparsity must be in [0, 1], got {sparsity!r}")
        key = jax.random.PRNGKey(seed) if key is None else key
        return cls.from_attention_mask(
            random_mask(key, (batch, heads, q_len, kv_len), sparsity), q_positions, kv_positions
        )

    # ------------------------------------------------------------------------------- transforms

    def apply_causal(self, offset: int | ArrayLike = 0) -> Self:
        """Keep keys `j <= i + offset` (positions counted from the start of the row). `offset` may be
        an int or per batch row [B]; 0 is a static flag, anything else is baked into a dense mask."""
        if is_zero(offset):
            return dataclasses.replace(self, causal=True, causal_mask_baked_in=True)
        off = per_row(offset, "offset")
        return self._baked(lambda i, j: j <= i + off, causal_mask_baked_in=True)

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
        traced = any(is_traced(side) for side in pair) or is_traced(offset)
        if not traced:
            pair = window_pair(pair if is_pair else sliding_window)
        if mode in (None, "default") and not traced and is_zero(offset):
            window = intersect_windows(pair, self.sliding_window)
            return dataclasses.replace(self, sliding_window=window, sliding_window_baked_in=True)
        off = per_row(offset, "offset")
        left, right = (jnp.asarray(side, jnp.int32) for side in pair)
        out = self._baked(lambda i, j: (j >= i + off - left) & (j <= i + off + right), sliding_window_baked_in=True)
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
        if is_traced(chunk_size) or not is_zero(offset):
            size = jnp.asarray(chunk_size, jnp.int32)
            off = per_row(offset, "offset")
            return self._baked(lambda i, j: (i // size == j // size) & (j <= i + off), chunked_mask_baked_in=True)
        chunk_size = positive_int("chunk_size", chunk_size)
        if self.chunk_size not in (None, chunk_size):
            raise ValueError(f"chunk_size {self.chunk_size} is already applied, got {chunk_size}")
        return dataclasses.replace(self, chunk_size=chunk_size, causal=True, chunked_mask_baked_in=True)

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
        lengths = int_array("kv_lengths", kv_lengths, batch, "[batch]")
        if not isinstance(lengths, jax.core.Tracer) and (np.asarray(lengths) < 0).any():
            raise ValueError(f"kv_lengths must be non-negative, got {np.asarray(lengths).tolist()}")
        if self.kv_length_limit is not None:
            lengths = jnp.minimum(lengths, self.kv_length_limit)
        out = dataclasses.replace(self, kv_length_limit=lengths, _cu_seqlens_kv=None)  # the lengths changed
        if q_len is None and sliding_window is None:
            return out
        row = q_rows = None
        if q_len is not None:
            if end_index is None:
                raise ValueError("apply_kv_lengths with q_len needs end_index=, where each row's queries end")
            q_rows = min(positive_int("q_len", q_len), self._dims()[1])
            row = jnp.clip(int_array("end_index", end_index, batch, "[batch]") - q_rows, 0, self._dims()[1] - q_rows)
        width = kv_len if sliding_window is None else min(positive_int("sliding_window", sliding_window), kv_len)
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
        types = int_array("token_type_ids", token_type_ids, (*batch, q_len), "[batch, seq]")
        return dataclasses.replace(self, token_type_ids=types, token_type_ids_baked_in=True)

    def _baked(self, allowed, **fields) -> Self:
        """The mask as it stands AND `allowed(i, j)` (positions, broadcast against `[..., 1|H, Sq, Sk]`)
        as the dense source, with `fields` replaced; the flags are then part of it. Segment ids stay, kv
        lengths folded in."""
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
            _ids_describe_only=not self._ids_in_mask,
            **fields,
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
            _cu_seqlens_q=self._cu_seqlens_q if q_start is None else None,
            _cu_seqlens_kv=None,
        )

    # ---------------------------------------------------------------------------------- queries

    @property
    def has_segments(self) -> bool:
        """Holds segment ids: given (also as cu_seqlens or a [B, S] padding mask), or describing a dense mask."""
        return self._q_segment_ids is not None or self._kv_segment_ids is not None

    @property
    def _ids_in_mask(self) -> bool:
        """The stored segment ids constrain the mask (rather than only describe a dense one)."""
        return self.has_segments and not (self._ids_describe_only and self.has_dense_mask)

    @property
    def has_dense_mask(self) -> bool:
        """Holds a dense [B, 1|H, Sq, Sk] mask (given, or baked by a transform)."""
        return self._attention_mask is not None

    def _dims(self) -> tuple[tuple[int, ...], int, int]:
        """(batch shape, Sq, Sk), read from the source arrays (so `vmap` and `shard_map` see local sizes):
        ids that take part in the mask, else the dense mask (ids that only describe it may be per head)."""
        if self._ids_in_mask and self._q_segment_ids is not None and self._kv_segment_ids is not None:
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
        """[B, Sq] int32: the segment ids held, or inferred from a dense mask (`mask_to_segment_ids`)."""
        return self.get_or_compute_segment_ids()[0]

    @property
    def kv_segment_ids(self) -> jax.Array:
        """[B, Sk] int32, kv lengths folded in as padding (-1)."""
        return self.get_or_compute_segment_ids()[1]

    @property
    def q_position_ids(self) -> jax.Array:
        """[B, Sq] int32: each query's position within its segment (counting restarts at every segment)."""
        return positions_in_runs(self.q_segment_ids)

    @property
    def q_attention_mask(self) -> jax.Array:
        """[B, Sq] int32: 1 for a real query (segment id >= 0), 0 for padding; for zeroing padded tokens."""
        return (self.q_segment_ids >= 0).astype(jnp.int32)

    @property
    def cu_seqlens_q(self) -> jax.Array | None:
        """The cumulative query lengths [B + 1] given to the constructor or `replace`, else None."""
        return self._cu_seqlens_q

    @property
    def cu_seqlens_kv(self) -> jax.Array | None:
        """The cumulative key lengths [B + 1] given to the constructor or `replace`, else None."""
        return self._cu_seqlens_kv

    @property
    def baked_in_masks(self) -> dict[str, bool]:
        """Which transforms the mask includes: {"causal", "sliding_window", "chunked", "token_type_ids"}."""
        return {key: getattr(self, field) for key, field in BAKED_IN_FIELDS.items()}

    @property
    def bias(self) -> jax.Array:
        """`create_bias()`: the mask as an additive float32 bias."""
        return self.create_bias()

    def create_bias(self, dtype: DTypeLike = jnp.float32) -> jax.Array:
        """The mask [B, 1|H, Sq, Sk] as an additive bias in the float `dtype`: 0 where attention is
        allowed, the dtype's most negative finite value elsewhere."""
        dtype = jnp.dtype(dtype)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(f"create_bias needs a float dtype, got {dtype}")
        blocked = jnp.asarray(jnp.finfo(dtype).min, dtype)
        return jnp.where(self.get_or_compute_attention_mask(), jnp.zeros((), dtype), blocked)

    def materialize_segment_ids(self, per_head: bool = False) -> Self:
        """Self when segment ids are held; else a copy holding the ids inferred from the dense mask
        (`mask_to_segment_ids`, per head with `per_head`), which describe it without changing it."""
        if self.has_segments:
            return self
        if not self.has_dense_mask:
            raise ValueError("MaskInfo has neither segment ids nor an attention mask to infer them from")
        q, kv = mask_to_segment_ids(self._attention_mask, per_head=per_head)
        return dataclasses.replace(self, _q_segment_ids=q, _kv_segment_ids=kv, _ids_describe_only=True)

    def materialize_attention_mask(self, dtype: DTypeLike = jnp.bool_) -> Self:
        """Self when a dense mask is held; else a copy holding the whole mask (every transform applied)
        as its dense source, whose `.attention_mask` comes in `dtype`."""
        if self.has_dense_mask:
            return self
        if not self.has_segments:
            raise ValueError("MaskInfo has neither an attention mask nor segment ids to build it from")
        return self._baked(lambda i, j: True).to_dtype(dtype)

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
        if self._ids_in_mask:
            q, kv = self._q_segment_ids[..., :, None], self._kv_segment_ids[..., None, :]
            hard = ((q == kv) & (q >= 0))[..., None, :, :]
        if self.has_dense_mask:
            hard = hard & self._attention_mask.astype(jnp.bool_)
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

        Ids not held (both, or the side a `replace` dropped) are inferred from the dense mask
        (`mask_to_segment_ids`: exact for block-diagonal masks; `per_head` gives them per head of a
        multi-head mask).
        """
        self._dims()  # a clear error when there is no source at all
        q, kv = self._q_segment_ids, self._kv_segment_ids
        if q is None or kv is None:
            inferred_q, inferred_kv = mask_to_segment_ids(self._attention_mask, per_head=per_head)
            q = inferred_q if q is None else q
            kv = inferred_kv if kv is None else kv
        return q, self._limited(kv)

    def _limited(self, kv: jax.Array | None) -> jax.Array | None:
        """Key segment ids [..., Sk] (or per head) with keys past the kv length limit marked padding."""
        if kv is None or self.kv_length_limit is None:
            return kv
        limit = self._kv_in_length(self._dims()[2])
        return jnp.where(limit[..., None, :] if kv.ndim > limit.ndim else limit, kv, -1)

    def get_or_compute_positions(self) -> tuple[jax.Array, jax.Array]:
        """(q_positions [B, Sq], kv_positions [B, Sk]): as given, else each token's position within
        its segment (`q_position_ids`; a single segment counts 0, 1, 2, ...)."""
        q, kv = self.get_or_compute_segment_ids()
        q_pos = self.q_positions if self.q_positions is not None else positions_in_runs(q)
        kv_pos = self.kv_positions if self.kv_positions is not None else positions_in_runs(kv)
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
        if self._ids_in_mask:
            return jnp.array_equal(self._q_segment_ids, self._kv_segment_ids)
        return True

    def to_dtype(self, dtype: DTypeLike) -> Self:
        """The same mask, whose `.attention_mask` comes in `dtype` (kernels always receive bool)."""
        return dataclasses.replace(self, mask_dtype=jnp.dtype(dtype).name)

    def replace(self, **fields) -> Self:
        """A copy with fields replaced.

        Upstream's names `attention_mask`, `q_segment_ids`, `kv_segment_ids`, `cu_seqlens_q` and
        `cu_seqlens_kv` replace those sources, None keeping them; any field (positions, `*_baked_in`
        flags, axis names, ...) is set as given, None included. When the mask or the ids change,
        cu_seqlens not given are cleared.

        A new attention mask ([B, Sq, Sk] or [B, 1|H, Sq, Sk], nonzero = attend) is the whole mask
        afterwards: pending transforms (causal, window, chunk, kv lengths, token types) are dropped, not
        applied on top of it; ids held beside it only describe it. Held ids and positions whose length
        no longer matches it are dropped (ids are then inferred from it on request); given ones must match.
        """
        fields_known = {f.name for f in dataclasses.fields(self)}
        unknown = fields.keys() - REPLACE_ALIASES.keys() - fields_known
        if unknown:
            raise TypeError(f"MaskInfo.replace got unknown fields {sorted(unknown)}")
        kept = {REPLACE_ALIASES[k] for k, v in fields.items() if k in REPLACE_ALIASES and v is None}
        changes = {REPLACE_ALIASES.get(k, k): v for k, v in fields.items() if not (k in REPLACE_ALIASES and v is None)}
        for name in ("_cu_seqlens_q", "_cu_seqlens_kv"):
            if changes.get(name) is not None:
                changes[name] = int_array(name[1:], changes[name], (None,), "[batch + 1]")
            elif name not in kept and SOURCE_FIELDS & changes.keys():
                changes.setdefault(name, None)
        if changes.get("_attention_mask") is not None:
            changes = self._whole_mask(changes)
        return dataclasses.replace(self, **changes)

    def _whole_mask(self, changes: dict) -> dict:
        """`changes` completed for a new `_attention_mask` that is the whole mask (see `replace`)."""
        mask = nonzero_mask("attention_mask", changes["_attention_mask"])
        mask = mask[:, None] if mask.ndim == 3 else mask
        if mask.ndim != 4:
            raise ValueError(
                "attention_mask must have shape [batch, q_len, kv_len] or [batch, 1 or heads, q_len, kv_len], "
                f"got {mask.shape}"
            )
        q_len, kv_len = mask.shape[-2:]
        out = dict(kv_length_limit=None, token_type_ids=None, causal=False, sliding_window=None, chunk_size=None)
        out.update(_ids_describe_only=True, **changes)  # fields given explicitly win over the resets
        held = {
            "_q_segment_ids": (self._q_segment_ids, q_len),
            "_kv_segment_ids": (self._limited(self._kv_segment_ids), kv_len),  # as part of the old mask
            "q_positions": (self.q_positions, q_len),
            "kv_positions": (self.kv_positions, kv_len),
        }
        for name, (value, length) in held.items():
            if name not in changes:
                out[name] = value if value is not None and value.shape[-1] == length else None
            elif changes[name] is not None and jnp.shape(changes[name])[-1] != length:
                shape = jnp.shape(changes[name])
                raise ValueError(f"{name.lstrip('_')} must have length {length} like the attention_mask, got {shape}")
        out["_attention_mask"] = mask
        return out

    def canonical(self, num_heads: int) -> CanonicalMask:
        """The kernel's view: segment ids and static flags, plus a dense mask only when they cannot
        express the mask (dense source, chunking, token types). Token types lift causality and the
        window, so with them both live in the dense mask and the flags are off."""
        num_heads = positive_int("num_heads", num_heads)
        if self.has_dense_mask and self._attention_mask.shape[-3] not in (1, num_heads):
            heads = self._attention_mask.shape[-3]
            raise ValueError(f"attention_mask has {heads} heads, expected 1 or num_heads={num_heads}")
        q, kv = self.get_or_compute_segment_ids() if self._ids_in_mask else (None, None)
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
        "_cu_seqlens_q",
        "_cu_seqlens_kv",
    ],
    meta_fields=[
        "causal",
        "sliding_window",
        "chunk_size",
        "mask_dtype",
        "_ids_describe_only",
        *BAKED_IN_FIELDS.values(),
        *AXIS_FIELDS,
    ],
)
