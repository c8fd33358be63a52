"""The transforms of a `MaskInfo`, each returning a new one: causal, sliding window, chunked, kv lengths and
token types applied, a dense mask or segment ids materialized, the dtype of `.attention_mask` set. A
transform that static flags cannot express is baked into the dense source (see `mask_info`)."""

from __future__ import annotations

import dataclasses
from typing import Literal, Self

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from ejkernel.types.mask_arrays import int_array, is_traced, is_zero, mask_to_segment_ids, per_row, positive_int
from ejkernel.types.mask_views import MaskViews
from ejkernel.types.windows import UNLIMITED, intersect_windows, window_pair


class MaskTransforms(MaskViews):
    """The transforms of `MaskInfo`, on top of its queries."""

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

    def to_dtype(self, dtype: DTypeLike) -> Self:
        """The same mask, whose `.attention_mask` comes in `dtype` (kernels always receive bool)."""
        return dataclasses.replace(self, mask_dtype=jnp.dtype(dtype).name)
