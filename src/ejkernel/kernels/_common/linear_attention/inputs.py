"""What the ops' arguments become before the recurrence: normalised q and k, lightning's decays, segment restarts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

L2_EPS = 1e-6  # q and k are divided by sqrt(Σ x² + L2_EPS) when `use_qk_l2norm` is on


def l2_normalize(x: jax.Array) -> jax.Array:
    """`x / sqrt(Σ x² + L2_EPS)` over the last axis, in float32."""
    x = x.astype(jnp.float32)
    return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def lightning_gamma(num_heads: int, layer_idx: int, num_layers: int) -> np.ndarray:
    """Lightning attention's fixed log decay per head: `-(8 / H)·(1 - layer_idx / num_layers)·h`."""
    return (-(8.0 / num_heads) * (1.0 - layer_idx / num_layers) * np.arange(num_heads)).astype(np.float32)


def segment_restarts(seg_ids: jax.Array) -> jax.Array:
    """`[B, S]` bool: the tokens where the state restarts from zeros.

    Those are the non-padding tokens (id >= 0) whose id differs from that of the row's previous
    non-padding token; the first one of a row continues from the initial state.
    """
    positions = jnp.arange(seg_ids.shape[1], dtype=jnp.int32)
    last_valid = lax.cummax(jnp.where(seg_ids >= 0, positions, -1), axis=1)
    previous = jnp.pad(last_valid[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    previous_id = jnp.take_along_axis(seg_ids, jnp.maximum(previous, 0), axis=1)
    return (seg_ids >= 0) & (previous >= 0) & (previous_id != seg_ids)


def delta_rule_inputs(query, key, beta, decay, seg_ids):
    """q, k, beta, decay and restarts as the delta-rule core takes them (q and k not yet normalised: the core
    does it, `linear_attention(l2norm=...)`).

    Padding tokens (negative segment id) get q = k = beta = decay = 0: they output zeros and leave
    the state alone.
    """
    if seg_ids is None:
        return query, key, beta, decay, None
    valid = (seg_ids >= 0)[:, :, None]
    q, k = jnp.where(valid[..., None], query, 0.0), jnp.where(valid[..., None], key, 0.0)
    beta = jnp.where(valid, beta, 0.0)
    decay = None if decay is None else jnp.where(valid, decay, 0.0)
    return q, k, beta, decay, segment_restarts(seg_ids)
