"""`AttentionCall`: the options of one canonical attention call, built and checked once.

Every flash attention implementation (XLA, Triton, Mosaic GPU, Pallas TPU, cuDNN), and the ops that
reuse them (ring, block-sparse, MLA, sdpa), takes `(query, key, value, bias, softmax_aux, call)`: the
tensors, then this value instead of a copy of the same keyword list per implementation. The semantics of
each field are those of `ejkernel.reference.flash_attention.flash_attention_reference`, whose keyword
signature stays the definition (the reference imports nothing from ejkernel).

The object is a JAX pytree: the array-valued options (segment ids, dense mask, dropout seed) are its
children, the static ones (scale, causal, window, soft cap, dropout rate) its auxiliary data, so it
crosses `jit`, `custom_vjp` and `shard_map` boundaries and hashes by value where it is static.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from ejkernel.reference.dropout import DEFAULT_DROPOUT_SEED
from ejkernel.types.windows import Window, window_pair

STATIC_FIELDS = ("softmax_scale", "causal", "sliding_window", "logits_soft_cap", "dropout_prob")
ARRAY_FIELDS = ("q_segment_ids", "kv_segment_ids", "attention_mask", "dropout_seed")
OPTION_NAMES = ARRAY_FIELDS[:3] + STATIC_FIELDS + ARRAY_FIELDS[3:]
"""The keyword options of the canonical contract, as the reference and upstream's callers spell them."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """The options of a canonical attention call: static ones (scale, masks' flags, soft cap, dropout rate)
    and array-valued ones (segment ids `[B, Sq]` / `[B, Sk]`, negative = padding; a boolean mask
    `[1|B, 1|H, Sq, Sk]`; a uint32 dropout seed, present exactly when `dropout_prob > 0`).

    Build it with `AttentionCall.of(query, ...)`, which checks and canonicalises; the plain constructor
    takes fields as they are (what `jax.tree_util` and specs trees need).
    """

    softmax_scale: float = dataclasses.field(metadata=dict(static=True))
    causal: bool = dataclasses.field(default=False, metadata=dict(static=True))
    sliding_window: Window | None = dataclasses.field(default=None, metadata=dict(static=True))
    logits_soft_cap: float | None = dataclasses.field(default=None, metadata=dict(static=True))
    dropout_prob: float = dataclasses.field(default=0.0, metadata=dict(static=True))
    q_segment_ids: Any = None
    kv_segment_ids: Any = None
    attention_mask: Any = None
    dropout_seed: Any = None

    @classmethod
    def of(
        cls,
        query,
        *,
        q_segment_ids=None,
        kv_segment_ids=None,
        attention_mask=None,
        softmax_scale: float | None = None,
        causal: bool = False,
        sliding_window: int | Window | None = None,
        logits_soft_cap: float | None = None,
        dropout_prob: float = 0.0,
        dropout_seed=None,
    ) -> AttentionCall:
        """The canonical call: scale `query.shape[-1] ** -0.5` by default, an int window `w` as `(w, w)`,
        seed 0 by default when `dropout_prob > 0` (and no seed otherwise), Python scalars for the statics.

        Raises ValueError for a rate outside `[0, 1)`, a non-positive soft cap, a negative window or segment
        ids given alone; TypeError for a float seed or a window that is neither an int nor a pair.
        """
        if not 0.0 <= dropout_prob < 1.0:
            raise ValueError(f"dropout_prob must be in [0, 1), got {dropout_prob}")
        if logits_soft_cap is not None and not logits_soft_cap > 0:
            raise ValueError(f"logits_soft_cap must be positive, got {logits_soft_cap}")
        if (q_segment_ids is None) != (kv_segment_ids is None):
            raise ValueError("q_segment_ids and kv_segment_ids must be given together")
        if dropout_seed is not None and not jnp.issubdtype(jnp.result_type(dropout_seed), jnp.integer):
            raise TypeError(f"dropout_seed must be an integer, got dtype {jnp.result_type(dropout_seed)}")
        if dropout_prob > 0.0:
            seed = jnp.asarray(DEFAULT_DROPOUT_SEED if dropout_seed is None else dropout_seed).astype(jnp.uint32)
        else:
            seed = None
        return cls(
            softmax_scale=float(query.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale),
            causal=bool(causal),
            sliding_window=None if sliding_window is None else window_pair(sliding_window, "sliding_window"),
            logits_soft_cap=None if logits_soft_cap is None else float(logits_soft_cap),
            dropout_prob=float(dropout_prob),
            q_segment_ids=q_segment_ids,
            kv_segment_ids=kv_segment_ids,
            attention_mask=attention_mask,
            dropout_seed=seed,
        )

    def invocation_options(self) -> dict[str, Any]:
        """The keyword options this call stands for, by their contract names: what an `Invocation` describes
        in its signature (so config caches and the shipped tuned tables key it as the keywords were keyed)."""
        return {name: getattr(self, name) for name in OPTION_NAMES}

    @property
    def segments(self) -> bool:
        return self.q_segment_ids is not None

    def used(self) -> dict[str, bool]:
        """Which optional features the call uses, by the names a declining implementation reports."""
        return {
            "segment ids": self.segments,
            "attention_mask": self.attention_mask is not None,
            "causal": self.causal,
            "sliding_window": self.sliding_window is not None,
            "logits_soft_cap": self.logits_soft_cap is not None,
            "dropout": self.dropout_prob > 0.0,
        }

    def replace(self, **changes) -> AttentionCall:
        return dataclasses.replace(self, **changes)


RING_OPTION_NAMES = ARRAY_FIELDS[:2] + STATIC_FIELDS[:4]
"""The keyword options ring attention's calls had before `AttentionCall`: no dense mask, no dropout."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RingCall(AttentionCall):
    """The call `ring_attention` builds: an `AttentionCall` that an `Invocation` describes by ring attention's
    own options (`RING_OPTION_NAMES`), so its config-cache signatures stay those of the keyword calls."""

    def invocation_options(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in RING_OPTION_NAMES}
