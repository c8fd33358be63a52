"""`MaskInfo`: an attention mask kept as what it was built from, made dense only on request.

Attention kernels are fastest when a mask arrives as segment ids plus static flags (causal, sliding
window): they can skip whole blocks and never read an `[Sq, Sk]` tensor from memory. `MaskInfo`
records the source (segment ids or a dense mask) and the transforms applied to it, and hands a kernel
that description through `canonical`, falling back to a dense mask only when nothing else can say it.

Semantics. Query `i` may attend key `j` of batch row `b` when the *hard* constraints hold (segments:
`q_seg[b, i] == kv_seg[b, j] >= 0`, or the dense source mask; and `j < kv_lengths[b]`) and the *soft*
constraints hold (causal `j <= i`, window `i - left <= j <= i + right`, chunk `i // c == j // c`),
where soft constraints are lifted between positions that share a nonzero token type. Positions are
aligned at the start: query `i` and key `i` are the same token, also when `Sq != Sk`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple, Self

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

Window = tuple[int, int]


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


def padding_segment_ids(name: str, cu: ArrayLike, length: int) -> jax.Array:
    """Segment ids [B, length] of a padded batch: row b is valid (0) for its first cu[b+1]-cu[b] tokens."""
    cu = _int_array(name, cu, (None,), "[batch + 1]")
    if cu.shape[0] < 2:
        raise ValueError(f"{name} must have at least 2 entries [0, n1, ...], got shape {cu.shape}")
    if not isinstance(cu, jax.core.Tracer):
        lengths = np.diff(np.asarray(cu))
        if (lengths < 0).any():
            raise ValueError(f"{name} must be non-decreasing, got {np.asarray(cu).tolist()}")
        if (lengths > length).any():
            raise ValueError(f"{name} gives lengths {lengths.tolist()}, longer than the axis ({length})")
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


@dataclasses.dataclass(frozen=True, eq=False)
class MaskInfo:
    """An attention mask as a pytree: its source arrays are leaves, its static transforms aux data.

    Build one with a `from_*` classmethod; exactly one source is set: segment ids (`q_segment_ids`
    [B, Sq], `kv_segment_ids` [B, Sk], negative = padding) or `attention_mask` [B, 1|H, Sq, Sk] bool.
    Methods work on any leading batch shape, so a `MaskInfo` can be `vmap`ped over its batch axis.
    """

    q_segment_ids: jax.Array | None = None
    kv_segment_ids: jax.Array | None = None
    attention_mask: jax.Array | None = None
    kv_length_limit: jax.Array | None = None
    token_type_ids: jax.Array | None = None
    causal: bool = False
    sliding_window: Window | None = None
    chunk_size: int | None = None

    # ----------------------------------------------------------------------------- constructors

    @classmethod
    def from_segments(cls, q_segment_ids: ArrayLike, kv_segment_ids: ArrayLike | None = None) -> Self:
        """From segment ids [B, Sq] (and [B, Sk], default: the query's): equal ids attend, -1 is padding."""
        q = _int_array("q_segment_ids", q_segment_ids, (None, None), "[batch, q_len]")
        if kv_segment_ids is None:
            return cls(q_segment_ids=q, kv_segment_ids=q)
        kv = _int_array("kv_segment_ids", kv_segment_ids, (q.shape[0], None), "[batch, kv_len]")
        return cls(q_segment_ids=q, kv_segment_ids=kv)

    @classmethod
    def from_attention_mask(cls, mask: ArrayLike) -> Self:
        """From a bool/int mask (nonzero = attend): [B, Sq, Sk], [B, 1|H, Sq, Sk], or [B, S] padding.

        A [B, S] mask marks valid tokens (for queries and keys alike) and becomes segment ids 0 / -1.
        """
        m = jnp.asarray(mask)
        if m.dtype != jnp.bool_ and not jnp.issubdtype(m.dtype, jnp.integer):
            raise TypeError(f"mask must be boolean or integer (nonzero = attend), got dtype {m.dtype}")
        m = m.astype(jnp.bool_)
        if m.ndim == 2:
            segments = jnp.where(m, 0, -1).astype(jnp.int32)
            return cls(q_segment_ids=segments, kv_segment_ids=segments)
        if m.ndim == 3:
            m = m[:, None]
        if m.ndim != 4:
            raise ValueError(
                "mask must have shape [batch, seq], [batch, q_len, kv_len] or "
                f"[batch, 1 or heads, q_len, kv_len], got {m.shape}"
            )
        return cls(attention_mask=m)

    @classmethod
    def from_cu_seqlens(
        cls,
        cu_seqlens_q: ArrayLike,
        cu_seqlens_k: ArrayLike | None = None,
        q_len: int | None = None,
        kv_len: int | None = None,
    ) -> Self:
        """From cumulative lengths [B+1] of a padded batch: row b holds a sequence of length
        `cu[b+1] - cu[b]` at its start, the rest is padding. `q_len` (the query axis length) is
        required; `cu_seqlens_k` defaults to `cu_seqlens_q` and `kv_len` to `q_len`."""
        if q_len is None:
            raise ValueError("q_len (the length of the query sequence axis) is required, got None")
        q_len = _positive_int("q_len", q_len)
        kv_len = q_len if kv_len is None else _positive_int("kv_len", kv_len)
        q = padding_segment_ids("cu_seqlens_q", cu_seqlens_q, q_len)
        if cu_seqlens_k is None and kv_len == q_len:
            return cls(q_segment_ids=q, kv_segment_ids=q)
        if cu_seqlens_k is None:
            kv = padding_segment_ids("cu_seqlens_q", cu_seqlens_q, kv_len)
        else:
            kv = padding_segment_ids("cu_seqlens_k", cu_seqlens_k, kv_len)
        if kv.shape[0] != q.shape[0]:
            raise ValueError(
                f"cu_seqlens_k must have batch + 1 = {q.shape[0] + 1} entries like cu_seqlens_q, got {kv.shape[0] + 1}"
            )
        return cls(q_segment_ids=q, kv_segment_ids=kv)

    @classmethod
    def from_random(
        cls,
        key: jax.Array,
        batch: int,
        q_len: int,
        kv_len: int | None = None,
        num_heads: int | None = None,
        sparsity: float = 0.5,
    ) -> Self:
        """A random dense mask [B, 1|H, Sq, Sk] dropping about `sparsity` of the pairs; every query
        row keeps at least one key. Meant for tests and benchmarks."""
        batch, q_len = _positive_int("batch", batch), _positive_int("q_len", q_len)
        kv_len = q_len if kv_len is None else _positive_int("kv_len", kv_len)
        heads = 1 if num_heads is None else _positive_int("num_heads", num_heads)
        if not 0.0 <= sparsity <= 1.0:
            raise ValueError(f"sparsity must be in [0, 1], got {sparsity!r}")
        return cls(attention_mask=_random_mask(key, (batch, heads, q_len, kv_len), sparsity))

    # ------------------------------------------------------------------------------- transforms

    def apply_causal(self) -> Self:
        """Keep keys `j <= i` (query and key positions counted from the start of the row)."""
        return dataclasses.replace(self, causal=True)

    def apply_sliding_window(self, window: int | tuple[int, int]) -> Self:
        """Keep keys `i - left <= j <= i + right`; an int `w` means `(w, w)`. Windows intersect."""
        return dataclasses.replace(self, sliding_window=intersect_windows(window_pair(window), self.sliding_window))

    def apply_chunked(self, chunk_size: int) -> Self:
        """Chunked local attention (Llama 4): keep keys with `i // chunk_size == j // chunk_size`."""
        chunk_size = _positive_int("chunk_size", chunk_size)
        if self.chunk_size not in (None, chunk_size):
            raise ValueError(f"chunk_size {self.chunk_size} is already applied, got {chunk_size}")
        return dataclasses.replace(self, chunk_size=chunk_size)

    def apply_kv_lengths(self, kv_lengths: ArrayLike) -> Self:
        """Treat keys at positions `>= kv_lengths[b]` as padding. Repeated calls keep the minimum."""
        batch, _, _ = self._dims()
        lengths = _int_array("kv_lengths", kv_lengths, batch, "[batch]")
        if not isinstance(lengths, jax.core.Tracer) and (np.asarray(lengths) < 0).any():
            raise ValueError(f"kv_lengths must be non-negative, got {np.asarray(lengths).tolist()}")
        if self.kv_length_limit is not None:
            lengths = jnp.minimum(lengths, self.kv_length_limit)
        return dataclasses.replace(self, kv_length_limit=lengths)

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

    # ---------------------------------------------------------------------------------- queries

    @property
    def has_segments(self) -> bool:
        """Built from segment ids (also from cu_seqlens or a [B, S] padding mask)."""
        return self.q_segment_ids is not None

    @property
    def has_dense_mask(self) -> bool:
        """Built from a dense [B, 1|H, Sq, Sk] mask."""
        return self.attention_mask is not None

    def _dims(self) -> tuple[tuple[int, ...], int, int]:
        """(batch shape, Sq, Sk), read from the source arrays (so `vmap` and `shard_map` see local sizes)."""
        if self.has_segments:
            return self.q_segment_ids.shape[:-1], self.q_segment_ids.shape[-1], self.kv_segment_ids.shape[-1]
        if self.has_dense_mask:
            return self.attention_mask.shape[:-3], *self.attention_mask.shape[-2:]
        raise ValueError("MaskInfo has no source: build it with a from_* constructor")

    def _kv_in_length(self, kv_len: int) -> jax.Array:
        """[..., Sk] True where a key lies before its row's kv length limit."""
        return jnp.arange(kv_len) < self.kv_length_limit[..., None]

    @functools.partial(jax.jit, static_argnames="dtype")
    def get_or_compute_attention_mask(self, dtype: DTypeLike = jnp.bool_) -> jax.Array:
        """The dense mask [..., 1|H, Sq, Sk] with every transform applied, cast to `dtype`.

        The query methods are jitted: called eagerly they run as one compiled program per shape.
        """
        _, q_len, kv_len = self._dims()
        if self.has_segments:
            q, kv = self.q_segment_ids[..., :, None], self.kv_segment_ids[..., None, :]
            hard = ((q == kv) & (q >= 0))[..., None, :, :]
        else:
            hard = self.attention_mask
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

    @jax.jit
    def get_or_compute_segment_ids(self) -> tuple[jax.Array, jax.Array]:
        """(q_segment_ids [..., Sq], kv_segment_ids [..., Sk]) int32, kv lengths folded in as padding.

        From a dense mask only padding survives: a query is valid (0) iff its row has any True (over
        all heads), a key iff its column has; which pairs attend is lost.
        """
        _, _, kv_len = self._dims()
        if self.has_segments:
            q, kv = self.q_segment_ids, self.kv_segment_ids
        else:
            q = jnp.where(self.attention_mask.any(axis=(-3, -1)), 0, -1).astype(jnp.int32)
            kv = jnp.where(self.attention_mask.any(axis=(-3, -2)), 0, -1).astype(jnp.int32)
        if self.kv_length_limit is not None:
            kv = jnp.where(self._kv_in_length(kv_len), kv, -1)
        return q, kv

    @jax.jit
    def q_lengths(self) -> jax.Array:
        """Valid (non-padding) queries per batch row, int32."""
        return jnp.sum(self.get_or_compute_segment_ids()[0] >= 0, axis=-1, dtype=jnp.int32)

    @jax.jit
    def kv_lengths(self) -> jax.Array:
        """Valid (non-padding) keys per batch row, int32."""
        return jnp.sum(self.get_or_compute_segment_ids()[1] >= 0, axis=-1, dtype=jnp.int32)

    def canonical(self, num_heads: int) -> CanonicalMask:
        """The kernel's view: segment ids and static flags, plus a dense mask only when they cannot
        express the mask (dense source, chunking, token types). Token types lift causality and the
        window, so with them both live in the dense mask and the flags are off."""
        num_heads = _positive_int("num_heads", num_heads)
        if self.has_dense_mask and self.attention_mask.shape[-3] not in (1, num_heads):
            heads = self.attention_mask.shape[-3]
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


jax.tree_util.register_dataclass(
    MaskInfo,
    data_fields=["q_segment_ids", "kv_segment_ids", "attention_mask", "kv_length_limit", "token_type_ids"],
    meta_fields=["causal", "sliding_window", "chunk_size"],
)
