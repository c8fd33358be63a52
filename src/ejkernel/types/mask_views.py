"""What a `MaskInfo` says about its mask: sizes, the dense mask, segment ids, positions and lengths, the
additive bias, the kernel's view (`canonical`, a `CanonicalMask`) and a text picture. A base class of
`MaskInfo`, reading the fields that `mask_info.MaskInfo` declares."""

from __future__ import annotations

import functools
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from ejkernel.types.mask_arrays import mask_to_segment_ids, positions_in_runs, positive_int
from ejkernel.types.windows import Window

BAKED_IN_FIELDS = {
    "causal": "causal_mask_baked_in",
    "sliding_window": "sliding_window_baked_in",
    "chunked": "chunked_mask_baked_in",
    "token_type_ids": "token_type_ids_baked_in",
}
"""`baked_in_masks` keys and the flags that answer them."""


class CanonicalMask(NamedTuple):
    """What an attention kernel consumes. The mask to apply is the AND of every field that is set:
    `q_segment_ids[i] == kv_segment_ids[j] >= 0`, `attention_mask`, `causal` and `sliding_window`."""

    q_segment_ids: jax.Array | None
    kv_segment_ids: jax.Array | None
    attention_mask: jax.Array | None
    causal: bool
    sliding_window: Window | None


class MaskViews:
    """The queries of `MaskInfo`: nothing here changes the mask."""

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
