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

This module holds the fields, the constructors and `replace`; the methods come from two base classes,
the queries in `mask_views` and the transforms in `mask_transforms`.
"""

from __future__ import annotations

import dataclasses
from typing import Self

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from ejkernel.types.mask_arrays import (
    check_bounds,
    checked_positions,
    int_array,
    mask_to_segment_ids,
    nonzero_mask,
    padding_ids,
    padding_segment_ids,
    positive_int,
    random_mask,
    segment_ids_to_mask,
    segment_ids_to_qkv_masks,
)
from ejkernel.types.mask_transforms import MaskTransforms
from ejkernel.types.mask_views import BAKED_IN_FIELDS, CanonicalMask
from ejkernel.types.windows import UNLIMITED, Window, clamp_window, intersect_windows, window_pair

__all__ = [  # and the helpers upstream code imports from here (their homes: `mask_arrays`, `windows`)
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
REPLACE_ALIASES = {
    "attention_mask": "_attention_mask",
    "q_segment_ids": "_q_segment_ids",
    "kv_segment_ids": "_kv_segment_ids",
    "cu_seqlens_q": "_cu_seqlens_q",
    "cu_seqlens_kv": "_cu_seqlens_kv",
}
"""Upstream's names that `replace` takes for the source fields (None: keep the field)."""
SOURCE_FIELDS = {"_attention_mask", "_q_segment_ids", "_kv_segment_ids"}


@dataclasses.dataclass(frozen=True, eq=False)
class MaskInfo(MaskTransforms):
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
